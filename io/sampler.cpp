// Distributed sampler (see sampler.h): one global order per (seed, epoch), sliced per rank.
#include "io/sampler.h"

#include <numeric>
#include <utility>

#include "core/error.h"
#include "core/philox.h"

namespace spotrain {
namespace io {
namespace {

constexpr uint32_t kShuffleStream = 0x5A4D;

// Uniform integer in [0, n), n > 0; 32-bit draws while n fits, 64-bit beyond.
uint64_t draw_below(Philox& rng, uint64_t n) {
  if (n <= 0xFFFFFFFFull) return rng.below(uint32_t(n));
  uint64_t hi = rng.next_u32(), lo = rng.next_u32();
  return uint64_t((static_cast<unsigned __int128>((hi << 32) | lo) * n) >> 64);
}

}  // namespace

Sampler::Sampler(int64_t dataset_size, uint64_t seed, bool shuffle)
    : size_(dataset_size), seed_(seed), shuffle_(shuffle) {
  SPOTRAIN_CHECK(dataset_size > 0, "sampler: dataset is empty");
}

std::vector<int64_t> Sampler::permutation(int64_t epoch) const {
  std::vector<int64_t> perm(static_cast<size_t>(size_));
  std::iota(perm.begin(), perm.end(), int64_t(0));
  if (!shuffle_) return perm;
  Philox rng(seed_, uint32_t(epoch), kShuffleStream);
  for (int64_t i = size_ - 1; i > 0; --i) {
    int64_t j = int64_t(draw_below(rng, uint64_t(i) + 1));
    std::swap(perm[size_t(i)], perm[size_t(j)]);
  }
  return perm;
}

std::vector<int64_t> Sampler::rank_slice(const std::vector<int64_t>& perm, int64_t batch,
                                         int64_t global_batch, int rank, int world) {
  SPOTRAIN_CHECK(world >= 1 && rank >= 0 && rank < world, "sampler: rank ", rank,
                 " is outside a world of ", world);
  SPOTRAIN_CHECK(global_batch > 0 && global_batch % world == 0, "sampler: global batch ", global_batch,
                 " does not divide evenly over ", world, " ranks");
  SPOTRAIN_CHECK(batch >= 0 && (batch + 1) * global_batch <= int64_t(perm.size()), "sampler: global batch ",
                 batch, " of ", global_batch, " samples lies outside the ", perm.size(),
                 "-sample permutation");
  const int64_t per_rank = global_batch / world;
  const int64_t begin = batch * global_batch + rank * per_rank;
  return std::vector<int64_t>(perm.begin() + begin, perm.begin() + begin + per_rank);
}

int64_t Sampler::batches_per_epoch(int64_t dataset_size, int64_t global_batch, bool drop_last) {
  SPOTRAIN_CHECK(global_batch > 0, "sampler: global batch must be positive, got ", global_batch);
  SPOTRAIN_CHECK(dataset_size >= 0, "sampler: negative dataset size ", dataset_size);
  return drop_last ? dataset_size / global_batch : (dataset_size + global_batch - 1) / global_batch;
}

std::vector<int64_t> eval_indices(int64_t dataset_size, int rank, int world) {
  SPOTRAIN_CHECK(world >= 1 && rank >= 0 && rank < world, "eval split: rank ", rank,
                 " is outside a world of ", world);
  SPOTRAIN_CHECK(dataset_size >= 0, "eval split: negative dataset size ", dataset_size);
  const int64_t begin = rank * dataset_size / world, end = (rank + 1) * dataset_size / world;
  std::vector<int64_t> out(size_t(end - begin));
  std::iota(out.begin(), out.end(), begin);
  return out;
}

}  // namespace io
}  // namespace spotrain
