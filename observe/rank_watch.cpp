// RankWatch (see rank_watch.h).
#include "observe/rank_watch.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"

namespace spotrain {

namespace {

// The lower middle of v (v not empty).
double lower_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

}  // namespace

std::vector<Straggler> find_stragglers(const std::vector<RankTimes>& ranks, double threshold) {
  std::vector<Straggler> out;
  if (ranks.size() < 2) return out;
  std::vector<double> compute, input, busy;
  for (const RankTimes& r : ranks) {
    compute.push_back(r.compute);
    input.push_back(r.input);
    busy.push_back(r.compute + r.input + r.wait);
  }
  const double mc = lower_median(compute), mi = lower_median(input), step = lower_median(busy);
  for (size_t i = 0; i < ranks.size(); ++i) {
    Straggler s;
    s.rank = int(i);
    if (mc > 0 && ranks[i].compute >= threshold * mc) {
      s.what = "compute";
      s.seconds = ranks[i].compute;
      s.median = mc;
    }
    // Input from a median of about none: held against 5% of the step instead.
    const double in_floor = std::max(mi, 0.05 * step);
    if (ranks[i].input >= threshold * in_floor && ranks[i].input - mi >= 0.05 * step &&
        (s.what.empty() || ranks[i].input / in_floor > s.ratio())) {
      s.what = "input";
      s.seconds = ranks[i].input;
      s.median = in_floor;
    }
    if (!s.what.empty()) out.push_back(s);
  }
  return out;
}

RankWatch::RankWatch(int world, int rank, double threshold, std::vector<std::string> hosts)
    : world_(world), rank_(rank), threshold_(threshold), hosts_(std::move(hosts)), streak_(size_t(world), 0) {
  hosts_.resize(size_t(world), "?");
}

void RankWatch::add_step(double step_seconds, double input_wait, double comm_wait, double device_compute) {
  if (skip_) {
    skip_ = false;
    return;
  }
  sum_.input += input_wait;
  sum_.wait += comm_wait;
  sum_.compute += device_compute >= 0 ? device_compute : std::max(0.0, step_seconds - input_wait - comm_wait);
  ++steps_;
}

std::vector<double> RankWatch::slots() const {
  std::vector<double> v(size_t(world_) * 3, 0.0);
  if (steps_ > 0) {
    const double n = double(steps_);
    v[size_t(rank_) * 3 + 0] = sum_.compute / n;
    v[size_t(rank_) * 3 + 1] = sum_.input / n;
    v[size_t(rank_) * 3 + 2] = sum_.wait / n;
  }
  return v;
}

RankWatch::Window RankWatch::take(const double* summed) {
  Window w;
  // Every rank counts the same steps. A window of a step or two (an epoch's end) is too few to
  // tell a straggler from a hiccup: it names no one and leaves the streaks be.
  const bool counted = steps_ >= kMinSteps;
  sum_ = RankTimes{};
  steps_ = 0;
  if (!counted) return w;
  for (int r = 0; r < world_; ++r)
    w.ranks.push_back(RankTimes{summed[r * 3], summed[r * 3 + 1], summed[r * 3 + 2]});
  w.stragglers = find_stragglers(w.ranks, threshold_);
  std::vector<int> next(size_t(world_), 0);
  for (const Straggler& s : w.stragglers) next[size_t(s.rank)] = streak_[size_t(s.rank)] + 1;
  streak_ = next;
  return w;
}

std::string RankWatch::describe(const Straggler& s) const {
  return str("rank ", s.rank, " on ", hosts_[size_t(s.rank)], ": ", s.what, " ", fmt_fixed(s.seconds, 3),
             " s/step, ", fmt_fixed(s.ratio(), 2), "x the median ", fmt_fixed(s.median, 3), " s");
}

nlohmann::json RankWatch::ranks_json(const Window& w) const {
  nlohmann::json a = nlohmann::json::array();
  int64_t units = 0;
  for (int c : shares_) units += c;
  for (size_t r = 0; r < w.ranks.size(); ++r) {
    a.push_back({{"rank", r}, {"host", hosts_[r]}, {"compute_s", w.ranks[r].compute},
                 {"input_s", w.ranks[r].input}, {"wait_s", w.ranks[r].wait}});
    if (r < shares_.size() && units > 0) {
      a.back()["micro_batches"] = shares_[r];
      a.back()["share"] = double(shares_[r]) / double(units);
    }
  }
  return a;
}

nlohmann::json RankWatch::stragglers_json(const Window& w) const {
  nlohmann::json a = nlohmann::json::array();
  for (const Straggler& s : w.stragglers)
    a.push_back({{"rank", s.rank}, {"host", hosts_[size_t(s.rank)]}, {"what", s.what},
                 {"seconds", s.seconds}, {"median", s.median}, {"ratio", s.ratio()},
                 {"windows", streak_[size_t(s.rank)]}});
  return a;
}

}  // namespace spotrain
