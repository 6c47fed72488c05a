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

Rebalancer::Rebalancer(const BatchSplit& first)
    : rates_(size_t(first.world()), 0.0), first_micro_(first.micro) {}

std::string Rebalancer::why_shares_stay(const BatchSplit& first) {
  if (first.units() > first.world() || (first.micro % 2 == 0 && first.micro / 2 >= smallest_micro(first.micro)))
    return "";
  return str("each rank trains one micro-batch of ", first.micro, " per step, which cannot be halved (",
             first.micro % 2 ? "an odd number of images" : str("fewer than ", 2 * smallest_micro(1), " images"),
             "); give each rank several micro-batches (--accum-steps) for shares to follow the ranks' rates");
}

std::optional<BatchSplit> Rebalancer::weigh(const RankWatch::Window& w, const BatchSplit& current) {
  if (w.ranks.size() != rates_.size() || size_t(current.world()) != rates_.size()) return std::nullopt;
  if (settling_) {  // the window that held the change: its steps ran on two splits
    settling_ = false;
    return std::nullopt;
  }
  for (size_t r = 0; r < rates_.size(); ++r) {
    const double compute = w.ranks[r].compute;
    if (!(compute > 0)) return std::nullopt;  // a rank without figures: nothing to weigh
    const double rate = double(current.counts[r] * current.micro) / compute;
    rates_[r] = rates_[r] > 0 ? kSmoothing * rate + (1 - kSmoothing) * rates_[r] : rate;
  }
  // From the run's first micro-batch: halved only as far as the rates need now (a host restored
  // to full speed gets whole micro-batches back).
  const BatchSplit next = split_by_rate(current.global(), first_micro_, rates_, kMargin);
  const double now = split_cost(current, rates_, first_micro_), then = split_cost(next, rates_, first_micro_);
  if (next == current || then > now * (1 - kMargin)) {
    calls_ = 0;
    return std::nullopt;
  }
  if (++calls_ < kConfirm) return std::nullopt;
  calls_ = 0;
  settling_ = true;
  std::string rates;
  for (size_t r = 0; r < rates_.size(); ++r) rates += str(r ? ", " : "", fmt_fixed(rates_[r], 1));
  line_ = str("shares of the global batch follow the ranks' rates: micro-batches of ", next.micro, " per rank ",
              list(next.counts), " (were ", list(current.counts),
              next.micro != current.micro ? str(" of ", current.micro, ": whole ones were too coarse") : std::string(),
              "), at ", rates, " images/s of compute; the step ", fmt_fixed(100 * (1 - then / now), 0), "% shorter");
  record_ = {{"micro_batch", next.micro}, {"micro_batches", next.counts}, {"previous_micro_batch", current.micro},
             {"previous", current.counts}, {"images_per_sec", nlohmann::json::array()},
             {"predicted_gain", 1 - then / now}};
  for (double r : rates_) record_["images_per_sec"].push_back(r);
  return next;
}

}  // namespace spotrain
