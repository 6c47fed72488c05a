// Threaded data loader: worker threads read, transform and batch samples in the background
// while the training step runs, and next() hands the batches out in order. Which samples a
// batch holds, and their pixels, depend only on (seed, epoch, batch, rank, world) and, with
// gradient accumulation, the micro-batch (io/sampler.h says which samples each one holds).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/pixel_norm.h"
#include "core/tensor.h"
#include "io/augment.h"
#include "io/dataset.h"
#include "io/image_transforms.h"
#include "io/sampler.h"
#include "io/transforms.h"

namespace spotrain {
namespace io {

struct Batch {
  // (N, C, H, W) logical, Layout::nhwc, host: fp32 normalized, or with Loader::pixels_u8() the
  // 8-bit pixels that `norm` normalizes (Backend::upload_pixels).
  Tensor images;
  PixelNorm norm;
  std::vector<int32_t> labels;       // N
  std::vector<int64_t> sample_ids;   // N dataset indices
  // Mixup / cutmix (LoaderOptions::mix): each sample's partner label and its own label's
  // weight; empty without mixing.
  std::vector<int32_t> labels_b;
  std::vector<float> lam;
  // batch_index: the step's index in the epoch; micro: which of its LoaderOptions::accum_steps
  // micro-batches this is (0 without accumulation).
  int64_t epoch = 0, batch_index = 0;
  int micro = 0;
};

struct LoaderOptions {
  int64_t batch_size = 128;   // per rank and micro-batch
  // Training: this rank's micro-batches per step (--accum-steps K, or its share of the global
  // batch), of `units` over all ranks (0: world x K, an even split) starting at the step's
  // micro-batch `first_unit` (-1: rank x K). A step's global batch is batch_size x units, and
  // next() hands out this rank's K micro-batches one by one, its j-th holding what rank
  // first_unit + j of `units` ranks would hold without accumulation (io/sampler.h).
  int accum_steps = 1;
  int64_t units = 0, first_unit = -1;
  int rank = 0, world = 1;
  bool train = true;          // shuffle + drop_last + random transforms; false: eval order, keep the remainder
  uint64_t seed = 0;
  int workers = 1;            // decoding threads
  int prefetch = 2;           // batches prepared ahead (at least `workers` are, so no worker idles)
  TransformOptions transforms;   // decoded datasets (IDX, synthetic)
  // Encoded datasets (JPEG folders, shards): decode, then RandomResizedCrop + flip when
  // training with `augment`, else resize + center crop; normalize with image.mean/std.
  ImageTransformOptions image;
  bool augment = true;
  // Training only, after the transforms above: random erasing per sample, then mixup/cutmix
  // over pairs (io/augment.h; needs an even batch size).
  ErasingOptions erasing;
  MixOptions mix;
  // Unreadable or corrupt images are skipped (the next readable sample takes their place),
  // counted and reported; more than this fraction of the dataset stops the loader with an error.
  double max_bad_fraction = 0.001;
  // Encoded datasets without random erasing or mixup/cutmix (which work on normalized
  // pixels): hand out 8-bit pixels for the device to normalize (a quarter of the bytes to
  // upload and to write); see Loader::pixels_u8().
  bool pixels_u8 = false;
  // Where batch images are allocated (nullptr: Allocator::host()); the trainer passes the
  // backend's host_staging_allocator() (pinned on CUDA, so the upload is one async DMA).
  // Must outlive the Loader and every Batch it hands out.
  Allocator* image_allocator = nullptr;
};

struct BadSample {
  int64_t index = 0;
  std::string what;  // "PATH: reason"
};

// Methods are called from one thread (the training loop); the workers are internal.
class Loader {
 public:
  Loader(std::shared_ptr<const Dataset> data, LoaderOptions opt);
  ~Loader();  // stops and joins the workers, also mid-epoch
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Starts producing the epoch's batches in the background, beginning at batch (step)
  // `first_batch` (for resume mid-epoch). Cancels any epoch in progress.
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // Blocks until the next batch is ready; false when the epoch is done. An exception thrown
  // while producing that batch is rethrown here (as spotrain::Error).
  bool next(Batch& out);
  // Steps per epoch: each one batch, or accum_steps micro-batches.
  int64_t batches_per_epoch() const { return batches_; }
  // Training: this rank's share from the next start_epoch() on: `accum_steps` micro-batches of
  // `micro` images from the step's micro-batch `first_unit` of `units` (micro x units is the
  // global batch, which stays); the epoch under way keeps the share it started with. A share that
  // changes mid-epoch restarts it at the next step: start_epoch(epoch, that step).
  void set_share(int64_t micro, int64_t units, int64_t first_unit, int accum_steps);
  int64_t samples_per_epoch() const { return samples_; }  // this rank's
  const LoaderOptions& options() const { return opt_; }
  // Whether batches hold 8-bit pixels (LoaderOptions::pixels_u8 where the data and the
  // augmentations allow it) rather than normalized fp32.
  bool pixels_u8() const { return u8_; }
  // The unreadable samples met so far (each once), in the order they were found.
  std::vector<BadSample> bad_samples() const;

 private:
  struct Plan {  // one start_epoch(): this rank's samples in order, (micro-)batch m at [m*B, (m+1)*B)
    int64_t epoch = 0;
    int accum = 1;      // micro-batches per step
    int64_t micro = 0;  // images per (micro-)batch
    std::vector<int64_t> order;
  };
  struct Slot {
    Batch batch;
    std::exception_ptr error;
  };
  struct Scratch {  // one per worker thread, reused
    std::vector<uint8_t> u8, bytes;
    std::vector<float> f;
  };
  void worker_loop();
  void produce(const Plan& plan, int64_t b, uint64_t gen, Batch& out, Scratch& s);
  // Random erasing, then mixup/cutmix, over a finished training batch.
  void augment_batch(Batch& out, int64_t epoch) const;
  // Reads, decodes and transforms encoded sample `id` into image i of `out` (normalized fp32
  // or 8-bit pixels); throws Error on a bad image.
  void decode_sample(int64_t id, int64_t epoch, Batch& out, int64_t i, int32_t* label,
                     Scratch& s) const;
  void note_bad(int64_t id, const std::string& why);

  std::shared_ptr<const Dataset> data_;
  LoaderOptions opt_;
  ImageShape shape_;
  bool u8_ = false;  // pixels_u8()
  Sampler sampler_;
  int64_t batches_ = 0;               // steps per epoch
  int accum_ = 1;                     // this rank's micro-batches per step (training), else 1
  int64_t micro_ = 0, units_ = 1, first_unit_ = 0;  // training: the step's micro-batches, this rank's first
  int64_t samples_ = 0;               // this rank's per epoch (at its share when the loader was made)
  int64_t window_ = 1;                // batches in flight or ready, at most
  std::vector<int64_t> base_order_;   // eval: this rank's slice (fixed for every epoch)

  std::mutex mu_;
  std::condition_variable work_cv_;   // workers wait for tasks
  std::condition_variable ready_cv_;  // next() waits for its batch
  std::shared_ptr<const Plan> plan_;  // guarded by mu_
  std::atomic<uint64_t> gen_{0};      // bumped by start_epoch (written under mu_)
  std::atomic<bool> stop_{false};
  // Micro-batch indices (step x accum_ + micro), guarded by mu_.
  int64_t next_task_ = 0, next_out_ = 0, end_batch_ = 0;
  std::map<int64_t, Slot> ready_;                         // guarded by mu_
  std::vector<std::thread> threads_;
  mutable std::mutex bad_mu_;
  std::set<int64_t> bad_ids_;       // guarded by bad_mu_
  std::vector<BadSample> bad_;      // guarded by bad_mu_
};

}  // namespace io
}  // namespace spotrain
