// The training loop: data -> forward -> loss -> backward -> SGD step -> LR schedule ->
// progress line and metrics, with evaluation on the test set after every epoch.
#pragma once
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "comm/comm_worker.h"
#include "comm/communicator.h"
#include "comm/reducer.h"
#include "checkpoints/async_writer.h"
#include "engine/config.h"
#include "engine/loss_scaler.h"
#include "engine/step.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "io/image_transforms.h"

namespace spotrain {

struct EvalResult {
  double loss = 0, top1 = 0, top5 = 0;  // top-k as fractions
  int64_t samples = 0;
};

struct TrainResult {
  int64_t steps = 0;
  double final_loss = 0, train_top1 = 0;
  EvalResult test;
  double images_per_sec = 0;
  double seconds = 0;
  int64_t skipped_steps = 0;  // fp16 overflows
  double loss_scale = 1;
  std::string checkpoint;  // path of the last checkpoint written ("" = none)
  int64_t bad_images = 0;  // unreadable training images skipped (this rank)
  bool stopped = false;    // stopped early by a signal after writing a checkpoint (exit 75)
};

// "fashion-mnist[:DIR]", "imagefolder:DIR" (DIR/train, DIR/val), "shards:DIR" (as written by
// `spotrain data pack`: DIR/train, DIR/val) or "synthetic" -> train and test datasets.
// image_size: the crop the imagefolder/shards transforms produce.
struct DataPair {
  std::shared_ptr<io::Dataset> train, test;
  std::string kind;  // "fashion-mnist" | "imagefolder" | "shards" | "synthetic"
};
// with_test = false: image folders and shards need no val/ split (bench reads train/ only).
DataPair open_data(const std::string& spec, int64_t train_limit, int64_t test_limit,
                   uint64_t seed, int image_size = 224, bool with_test = true);

// ImageNet transforms for an encoded dataset: crop image_shape().h, eval resize to h*256/224.
io::ImageTransformOptions image_transforms_for(const io::Dataset& d);

class Trainer {
 public:
  explicit Trainer(const RunConfig& cfg);
  ~Trainer();
  TrainResult run();
  EvalResult evaluate(const io::Dataset& data, int64_t batch_size);
  Model& model() { return *model_; }
  Backend& backend() { return *backend_; }
  Sgd& optimizer() { return *sgd_; }
  LossScaler& scaler() { return *scaler_; }
  Communicator& comm() { return *comm_; }

 private:
  // Where training continues after --resume (zeros: from scratch).
  struct ResumePoint {
    int64_t step = 0, epoch = 0, batch_in_epoch = 0;
  };
  void check_ranks_agree();
  void check_checkpoint_dir();
  // Rank 0 finds and loads the checkpoint and broadcasts the state to every rank (other
  // nodes need no copy of the file). A checkpoint from another rank count keeps its global
  // batch: the per-rank --batch-size becomes global / world.
  ResumePoint resume();
  // Rank 0 snapshots the state and writes ckpt-<step>.h5: in the background, or, with
  // `sync`, before returning (every rank then waits at a barrier). Returns the path.
  std::string write_checkpoint(int64_t step, int64_t epoch, int64_t batch_in_epoch, bool sync);
  // Reports a background write that finished (or failed) since the last call.
  void poll_checkpoint_writer();
  void broadcast_buffers();
  RunConfig cfg_;
  double created_ = 0;  // when the Trainer was made: --max-wall-time counts from here
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<CommWorker> worker_;
  std::unique_ptr<Reducer> reducer_;
  DataPair data_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Sgd> sgd_;
  std::unique_ptr<LossScaler> scaler_;
  std::unique_ptr<StepRunner> runner_;
  FILE* metrics_ = nullptr;
  std::unique_ptr<AsyncCheckpointWriter> writer_;  // rank 0 with a --ckpt-dir
  std::string writing_;                            // path of the write in flight
  Tensor snap_params_, snap_momentum_;             // warm host buffers for snapshots
  FILE* sample_log_ = nullptr;                     // SPOTRAIN_SAMPLE_LOG test hook
};

// Evaluates `model` over a whole dataset with fixed (non-random) transforms.
// With a worker, the set is split across ranks and the counts summed, so every rank gets
// the whole set's figures. `on_batch`, when given, sees each batch with its logits.
using EvalBatchHook = std::function<void(const io::Batch&, const Tensor& logits)>;
EvalResult evaluate_model(Model& model, const io::Dataset& data, const std::string& data_kind,
                          int64_t batch_size, DType compute = DType::f32,
                          CommWorker* worker = nullptr, int workers = 1,
                          double max_bad_fraction = 0.001,
                          const EvalBatchHook& on_batch = nullptr);

}  // namespace spotrain
