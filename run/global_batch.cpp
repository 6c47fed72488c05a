// The global batch and its splits (see global_batch.h).
#include "run/global_batch.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace spotrain {

int64_t BatchSplit::units() const { return std::accumulate(counts.begin(), counts.end(), int64_t(0)); }

int64_t BatchSplit::first(int rank) const {
  return std::accumulate(counts.begin(), counts.begin() + rank, int64_t(0));
}

bool BatchSplit::even() const {
  return std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<int>()) == counts.end();
}

std::string BatchSplit::text() const {
  if (counts.empty()) return "no split";
  if (even()) return counts[0] == 1 ? str(micro, " per rank") : str(micro, " x ", counts[0], " micro-batches per rank");
  std::string c;
  for (size_t r = 0; r < counts.size(); ++r) c += str(r ? ", " : "", counts[r]);
  return str("micro-batches of ", micro, ": ", c, " per rank");
}

int64_t global_batch(int64_t micro, int64_t world, int64_t accum) {
  SPOTRAIN_CHECK(micro > 0 && world > 0 && accum > 0, "a global batch needs a positive batch, rank count and ",
                 "micro-batch count, got ", micro, " x ", world, " ranks x ", accum);
  // Steps and the samples they consume must fit the 64-bit counters with room to spare.
  constexpr int64_t kMost = int64_t(1) << 40;
  SPOTRAIN_CHECK(micro <= kMost / world / accum, "a global batch of ", micro, " x ", world, " ranks x ", accum,
                 " micro-batches is more than the sample counters hold");
  return micro * world * accum;
}

namespace {

// The micro-batch of an even split (0: none): a rank's share whole where it fits, else its
// largest divisor of at most max_micro, when that holds at least half of max_micro.
int64_t even_micro(int64_t global, int world, int64_t max_micro) {
  if (global % world != 0) return 0;
  const int64_t share = global / world;
  if (share <= max_micro) return share;
  for (int64_t m = max_micro; 2 * m >= max_micro; --m)
    if (share % m == 0) return m;
  return 0;
}

// "1, 2, 4 or 8 ranks", or "1, 2, ... or one of 5 larger rank counts".
std::string count_list(const std::vector<int>& ok) {
  std::string s;
  const size_t shown = std::min<size_t>(ok.size(), 12);
  for (size_t i = 0; i < shown; ++i)
    s += str(i == 0 ? "" : i + 1 == shown && shown == ok.size() ? " or " : ", ", ok[i]);
  return shown < ok.size() ? s + str(" or one of ", ok.size() - shown, " larger rank counts") : s + " ranks";
}

}  // namespace

bool split_evenly(int64_t global, int world, int64_t max_micro, BatchSplit* out, std::string* why) {
  SPOTRAIN_CHECK(global > 0 && world > 0 && max_micro > 0, "internal: split of a global batch of ", global,
                 " over ", world, " ranks of at most ", max_micro);
  const int64_t m = even_micro(global, world, max_micro);
  if (m > 0) {
    out->micro = m;
    out->counts.assign(size_t(world), int(global / world / m));
    return true;
  }
  const bool divides = global % world == 0;
  const std::vector<int> ok = rank_counts_that_split(global, max_micro, int(std::min<int64_t>(global, 1 << 20)));
  *why = str("it does not divide over ", world, " ranks",
             divides ? str(" into equal micro-batches of at most --batch-size ", max_micro, " and at least half of it (",
                           global / world, " images per rank and step)")
                     : std::string(),
             "; the global batch is ranks x per-rank batch x micro-batches per step. It divides over ",
             ok.empty() ? std::string("no rank count") : count_list(ok),
             divides ? str(", or with a --batch-size that divides ", global / world) : std::string());
  return false;
}

BatchSplit split_evenly(int64_t global, int world, int64_t max_micro) {
  BatchSplit s;
  std::string why;
  if (!split_evenly(global, world, max_micro, &s, &why)) throw Error(why);
  return s;
}

std::vector<int> rank_counts_that_split(int64_t global, int64_t max_micro, int up_to) {
  std::vector<int> ok;
  for (int w = 1; w <= up_to; ++w)
    if (even_micro(global, w, max_micro) > 0) ok.push_back(w);
  return ok;
}

BatchSplit first_split(int world, int64_t batch, int accum) {
  global_batch(batch, world, accum);  // checks the factors and the product
  BatchSplit s;
  s.micro = batch;
  s.counts.assign(size_t(world), accum);
  return s;
}

std::vector<int> counts_by_rate(int64_t units, const std::vector<double>& rates, int min_units) {
  const int64_t ranks = int64_t(rates.size());
  SPOTRAIN_CHECK(ranks > 0 && min_units >= 1 && units >= ranks * min_units, "internal: ", units,
                 " micro-batches cannot give ", ranks, " ranks at least ", min_units, " each");
  for (double r : rates) SPOTRAIN_CHECK(r > 0, "internal: a rank's rate is ", r, ", not positive");
  std::vector<int> c(size_t(ranks), min_units);
  for (int64_t left = units - ranks * min_units; left > 0; --left) {
    size_t best = 0;
    for (size_t r = 1; r < c.size(); ++r)
      if ((c[r] + 1) / rates[r] < (c[best] + 1) / rates[best]) best = r;
    ++c[best];
  }
  return c;
}

int64_t smallest_micro(int64_t first_micro) { return std::max<int64_t>(8, (first_micro + 3) / 4); }

double split_cost(const BatchSplit& split, const std::vector<double>& rates, int64_t first_micro) {
  double cost = split_slowdown(split.counts, rates);
  for (int64_t m = split.micro; m < first_micro; m *= 2) cost *= 1 + kHalvingCost;
  return cost;
}

BatchSplit split_by_rate(int64_t global, int64_t first_micro, const std::vector<double>& rates, double margin) {
  SPOTRAIN_CHECK(first_micro > 0 && global % first_micro == 0, "internal: a global batch of ", global,
                 " in micro-batches of ", first_micro);
  BatchSplit best;
  best.micro = first_micro;
  best.counts = counts_by_rate(global / first_micro, rates);
  const int64_t smallest = smallest_micro(first_micro);
  while (split_slowdown(best.counts, rates) > 1 + margin && best.micro % 2 == 0 && best.micro / 2 >= smallest) {
    BatchSplit half;
    half.micro = best.micro / 2;
    half.counts = counts_by_rate(global / half.micro, rates);
    if (split_cost(half, rates, first_micro) >= split_cost(best, rates, first_micro)) break;
    best = half;
  }
  return best;
}

double split_slowdown(const std::vector<int>& counts, const std::vector<double>& rates) {
  SPOTRAIN_CHECK(counts.size() == rates.size() && !counts.empty(), "internal: ", counts.size(), " counts for ",
                 rates.size(), " rates");
  double slowest = 0, total_rate = 0, units = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    slowest = std::max(slowest, counts[r] / rates[r]);
    total_rate += rates[r];
    units += counts[r];
  }
  return slowest / (units / total_rate);
}

}  // namespace spotrain
