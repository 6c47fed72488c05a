// Distributed sampler: the global data order is a function of (seed, epoch) only, so every
// rank count sees the same global batches and a job can resume on a different number of
// ranks. Rank r takes the r-th contiguous slice of each global batch. With gradient
// accumulation (K micro-batches per step on each rank) the global batch is cut into world x K
// slices: micro-batch j of rank r is slice r x K + j, exactly the batch rank r x K + j of a run
// on world x K ranks sees, so K micro-batches on one rank train as K ranks do, and a run that
// resumes on fewer ranks with a larger K (run/resume.h) trains on the same batches.
#pragma once
#include <cstdint>
#include <vector>

namespace spotrain {
namespace io {

class Sampler {
 public:
  Sampler(int64_t dataset_size, uint64_t seed, bool shuffle);

  // Global permutation of [0, size) for the epoch: Fisher-Yates driven by
  // Philox(seed, uint32(epoch), 0x5A4D); the identity when shuffle is off.
  std::vector<int64_t> permutation(int64_t epoch) const;

  // This rank's part of global batch `batch`: permutation positions
  // [b*G + r*G/world, b*G + (r+1)*G/world) with G = global_batch. G must divide by world,
  // and the global batch must lie inside the permutation. Micro-batch j of rank r with K per
  // step: rank_slice(perm, batch, G, r * K + j, world * K).
  static std::vector<int64_t> rank_slice(const std::vector<int64_t>& perm, int64_t batch,
                                         int64_t global_batch, int rank, int world);

  // Global batches per epoch: size / G when drop_last (training), else ceil(size / G).
  static int64_t batches_per_epoch(int64_t dataset_size, int64_t global_batch, bool drop_last);

  int64_t size() const { return size_; }
  uint64_t seed() const { return seed_; }
  bool shuffle() const { return shuffle_; }

 private:
  int64_t size_;
  uint64_t seed_;
  bool shuffle_;
};

// Evaluation order (no shuffle, nothing dropped): rank r gets the contiguous, near-equal
// slice [r*size/world, (r+1)*size/world) of [0, size); the slices cover every sample once.
std::vector<int64_t> eval_indices(int64_t dataset_size, int rank, int world);

}  // namespace io
}  // namespace spotrain
