// Stragglers seen while training: each rank's own time per step over a progress window --
// compute (the step without its waits), input (its wait for the batch) and wait (for the
// other ranks' gradients) -- gathered into every rank at the progress line, riding on the
// window's own all-reduce, and the ranks whose compute or input per step takes at least
// --straggler-threshold times the median over ranks, each named with its host.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/comm_worker.h"

namespace spotrain {

// One rank's seconds per step over a window.
struct RankTimes {
  double compute = 0, input = 0, wait = 0;
  double busy() const { return compute + input; }  // what the step waits for on this rank
};

// A rank named in a window: what of its step is slow, and by how much.
struct Straggler {
  int rank = 0;
  std::string what;  // "compute" or "input"
  double seconds = 0, median = 0;  // per step: the rank's, and the median over ranks
  double ratio() const { return median > 0 ? seconds / median : 0; }
};

// The ranks at least `threshold` x the median over ranks (the lower middle for an even count,
// so that of two ranks the slower is held against the faster) in compute, or in input where
// the input wait is also at least 5% of the median rank's step: a few milliseconds of input
// against a few tenths of one is no straggler. One entry per rank (its worse ratio).
std::vector<Straggler> find_stragglers(const std::vector<RankTimes>& ranks, double threshold);

class RankWatch {
 public:
  // threshold: --straggler-threshold; hosts: each rank's host label (comm/hosts.h).
  RankWatch(int world, int rank, double threshold, std::vector<std::string> hosts);

  // This rank's step: its seconds, and of them its waits for the batch and for the gradients;
  // device_compute (>= 0): its compute on the device's clock, taken in place of the rest (a GPU
  // rank's host waits for the device, and so for the other ranks, outside comm_wait).
  void add_step(double step_seconds, double input_wait, double comm_wait, double device_compute = -1);
  // The next step is not counted (the first of a process or an epoch: the loader starting, an
  // evaluation before it; the first after the shares changed).
  void skip_next() { skip_ = true; }
  // Each rank's micro-batches per step (its share of the global batch), for the records.
  void set_shares(std::vector<int> counts) { shares_ = std::move(counts); }
  // The values this rank adds into the window's all-reduce (world x 3: its own slot filled,
  // every other 0, so each slot's sum is exact), and the window taken from their sums on
  // every rank alike.
  std::vector<double> slots() const;
  static constexpr int64_t kMinSteps = 3;  // counted steps a window needs to name anyone
  struct Window {
    std::vector<RankTimes> ranks;  // per step, by rank (empty when no step counted)
    std::vector<Straggler> stragglers;
  };
  Window take(const double* summed);

  // How many windows in a row each rank has been named, as of the last take().
  int streak(int rank) const { return streak_[size_t(rank)]; }
  const std::vector<std::string>& hosts() const { return hosts_; }
  double threshold() const { return threshold_; }
  // "rank 2 on 10.0.0.3: compute 0.210 s/step, 2.05x the median 0.102 s" for one straggler.
  std::string describe(const Straggler& s) const;
  // The window's per-rank record (metrics.jsonl's "ranks": rank, host, compute_s, input_s,
  // wait_s per step, and micro_batches and share of the global batch where set_shares was
  // called) and its stragglers' ("stragglers": rank, host, what, ratio, windows).
  nlohmann::json ranks_json(const Window& w) const;
  nlohmann::json stragglers_json(const Window& w) const;

 private:
  int world_, rank_;
  double threshold_;
  std::vector<std::string> hosts_;
  RankTimes sum_;
  int64_t steps_ = 0;
  bool skip_ = true;
  std::vector<int> streak_;
  std::vector<int> shares_;
};

}  // namespace spotrain
