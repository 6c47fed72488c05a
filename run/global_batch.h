// The global batch, in one place: the images of one optimizer step over all ranks, cut into
// micro-batches of one size that the ranks share out (evenly, or by a count per rank), the
// even split of a checkpoint's global batch over another rank count, and the share of each
// rank by its rate. Pure functions: resume, the leave rule, the rebalancer, the plan and
// `spotrain batch` (which mpirun.sh asks) all take their answers from here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace spotrain {

// One step's global batch as the ranks train it: micro-batches of `micro` images each, rank r
// taking counts[r] of them. The step's micro-batches are numbered in rank order: rank r's j-th
// is the step's micro-batch first(r) + j, the same images whatever the counts (io/sampler.h),
// so a split changes who computes a micro-batch, never what it holds.
struct BatchSplit {
  int64_t micro = 0;
  std::vector<int> counts;  // per rank, each >= 1

  int world() const { return int(counts.size()); }
  int count(int rank) const { return counts[size_t(rank)]; }
  int64_t units() const;  // micro-batches per step, over all ranks
  int64_t global() const { return micro * units(); }
  int64_t first(int rank) const;  // the step's micro-batch that is rank's first
  bool even() const;
  // "128 per rank" / "128 x 2 micro-batches per rank" / "micro-batches of 32: 5, 5, 2 per rank".
  std::string text() const;
  bool operator==(const BatchSplit& o) const { return micro == o.micro && counts == o.counts; }
  bool operator!=(const BatchSplit& o) const { return !(*this == o); }
};

// Images per step: ranks x micro-batch x micro-batches per rank. Throws Error when a factor is
// not positive or the product would not fit the step and sample counters.
int64_t global_batch(int64_t micro, int64_t world, int64_t accum);

// The even split of `global` over `world` ranks whose micro-batch may not exceed `max_micro`
// (--batch-size: what each rank's memory was sized for): global / world images per rank, as
// one micro-batch where they fit, else as the fewest equal micro-batches of at most
// max_micro, which must hold at least half of it (smaller ones would change the batch-norm
// statistics and the kernels' speed too much to pass for the same run). False, with why and
// the rank counts that would work, when there is none: world does not divide global, or no
// micro-batch of at least max_micro / 2 divides a rank's share.
bool split_evenly(int64_t global, int world, int64_t max_micro, BatchSplit* out, std::string* why);
// The same, throwing Error with the why.
BatchSplit split_evenly(int64_t global, int world, int64_t max_micro);
// The rank counts from 1 to up_to over which split_evenly splits `global`.
std::vector<int> rank_counts_that_split(int64_t global, int64_t max_micro, int up_to);

// The run's first split: world x batch x accum images, micro-batches of `batch`, `accum` per rank.
BatchSplit first_split(int world, int64_t batch, int accum);

// `units` micro-batches dealt out by `rates` (micro-batches per second, one per rank,
// positive), each rank at least `min_units`: one at a time to the rank that would finish it
// soonest ((count + 1) / rate least, ties to the lower rank), which gives the counts whose
// slowest rank finishes first. Equal rates give an even split wherever units divide. Throws
// Error when units < min_units x ranks or a rate is not positive.
std::vector<int> counts_by_rate(int64_t units, const std::vector<double>& rates, int min_units = 1);
// The smallest micro-batch that shares by rate may cut a run's first micro-batch of `first_micro`
// images into: a quarter of it, and never below 8 images (batch norm's statistics come from each
// micro-batch).
int64_t smallest_micro(int64_t first_micro);
// What a micro-batch of half the images costs more per image: 2.5-3.5% a halving measured on the
// CPU (ResNet-20 at 64 -> 32 -> 16, ResNet-50 at 32 -> 16 -> 8, docs/PERFORMANCE.md, "A fleet of
// unequal hosts"); taken as 5%, as a GPU's smaller GEMMs and more launches per image cost more.
constexpr double kHalvingCost = 0.05;
// A split's step at `rates` against an ideal split of micro-batches of `first_micro` images:
// split_slowdown, times (1 + kHalvingCost) for each halving of first_micro.
double split_cost(const BatchSplit& split, const std::vector<double>& rates, int64_t first_micro);
// A global batch of `global` images dealt out by `rates` (images per second, one per rank; only
// their ratios count): counts_by_rate of micro-batches of `first_micro` images, and while those
// leave the step more than `margin` longer than an ideal split, of half as many images where that
// costs less (split_cost), down to smallest_micro(first_micro).
BatchSplit split_by_rate(int64_t global, int64_t first_micro, const std::vector<double>& rates, double margin);
// The step's time under `counts` at `rates` (micro-batches per second of each rank), relative
// to the ideal where every rank finishes together: max_r(counts[r] / rates[r]) against
// units / sum(rates). 1 is a perfect split.
double split_slowdown(const std::vector<int>& counts, const std::vector<double>& rates);

}  // namespace spotrain
