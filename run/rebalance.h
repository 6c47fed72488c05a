// Shares that follow rates (--straggler-action rebalance, the default with several ranks, and
// leave): each rank's share of the global batch, in whole micro-batches of the run's one size
// (run/global_batch.h), follows its measured rate, so that a fleet of unequal hosts trains at
// about the sum of their speeds. The rate of a rank is its images per second of compute over a
// progress window (observe/rank_watch.h: the same gathered figures on every rank),
// smoothed over windows; a new split is taken only when it would shorten the step by a margin
// two windows in a row, and never in the window after a change. Where whole micro-batches are too
// coarse for the rates (the best counts still leave the step a margin longer than an ideal split),
// the micro-batch is halved where that pays for what smaller micro-batches cost (kHalvingCost), at
// most down to a quarter of the run's first and never below 8 images (split_by_rate,
// smallest_micro), and given back when the rates no longer need it: every rank's batch-norm statistics then come from smaller micro-batches, so an even
// fleet, which never needs it, keeps its own. Every rank weighs the same figures alike, so all
// reach the same verdict at the same step with no extra agreement.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "observe/rank_watch.h"
#include "run/global_batch.h"

namespace spotrain {

class Rebalancer {
 public:
  static constexpr double kSmoothing = 0.5;  // weight of a new window's rate in the smoothed one
  static constexpr double kMargin = 0.10;    // a change must shorten the step by at least this
  static constexpr int kConfirm = 2;         // windows in a row that must call for it

  // first: the run's split when it started (its micro-batch bounds the halving).
  explicit Rebalancer(const BatchSplit& first);
  // Why the shares of `first` cannot move at all ("" where they can): one micro-batch per rank
  // that cannot be halved.
  static std::string why_shares_stay(const BatchSplit& first);
  // After a progress window whose split was `current` (every rank alike): the split to train
  // with from the next step on, or none to keep `current`. Returns none for a window without
  // figures (too few steps) and for the window in which a change took effect.
  std::optional<BatchSplit> weigh(const RankWatch::Window& w, const BatchSplit& current);
  // The smoothed rates (images per second of compute, by rank; 0 before any window).
  const std::vector<double>& rates() const { return rates_; }
  // The change weigh() returned last: its log line, and its metrics record.
  const std::string& last_line() const { return line_; }
  const nlohmann::json& last_record() const { return record_; }

 private:
  std::vector<double> rates_;
  int64_t first_micro_;     // the run's first micro-batch: halvings count from it
  int calls_ = 0;           // windows in a row that called for a change
  bool settling_ = false;   // the next window straddles the change just made
  std::string line_;
  nlohmann::json record_;
};

}  // namespace spotrain
