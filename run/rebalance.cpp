// Rebalancer (see rebalance.h).
#include "run/rebalance.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"

namespace spotrain {

namespace {

std::string list(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += str(i ? ", " : "", v[i]);
  return s;
}

}  // namespace

Rebalancer::Rebalancer(int world) : rates_(size_t(world), 0.0) {}

std::optional<BatchSplit> Rebalancer::weigh(const RankWatch::Window& w, const BatchSplit& current) {
  if (w.ranks.size() != rates_.size() || size_t(current.world()) != rates_.size()) return std::nullopt;
  if (settling_) {  // the window that held the change: its steps ran on two splits
    settling_ = false;
    return std::nullopt;
  }
  for (size_t r = 0; r < rates_.size(); ++r) {
    const double compute = w.ranks[r].compute;
    if (!(compute > 0)) return std::nullopt;  // a rank without figures: nothing to weigh
    const double rate = double(current.counts[r]) / compute;
    rates_[r] = rates_[r] > 0 ? kSmoothing * rate + (1 - kSmoothing) * rates_[r] : rate;
  }
  const std::vector<int> best = counts_by_rate(current.units(), rates_);
  const double now = split_slowdown(current.counts, rates_), then = split_slowdown(best, rates_);
  if (best == current.counts || then > now * (1 - kMargin)) {
    calls_ = 0;
    return std::nullopt;
  }
  if (++calls_ < kConfirm) return std::nullopt;
  calls_ = 0;
  settling_ = true;
  BatchSplit next = current;
  next.counts = best;
  std::string rates;
  for (size_t r = 0; r < rates_.size(); ++r)
    rates += str(r ? ", " : "", fmt_fixed(rates_[r] * double(current.micro), 1));
  line_ = str("shares of the global batch follow the ranks' rates: micro-batches of ", current.micro, " per rank ",
              list(best), " (were ", list(current.counts), "), at ", rates,
              " images/s of compute; the step ", fmt_fixed(100 * (1 - then / now), 0), "% shorter");
  record_ = {{"micro_batch", current.micro}, {"micro_batches", best}, {"previous", current.counts},
             {"images_per_sec", nlohmann::json::array()}, {"predicted_gain", 1 - then / now}};
  for (double r : rates_) record_["images_per_sec"].push_back(r * double(current.micro));
  return next;
}

}  // namespace spotrain
