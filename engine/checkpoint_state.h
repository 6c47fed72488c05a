// What of a Model and its optimizer goes into a checkpoint, and how it comes back: the
// bridge between the engine's training state and checkpoints/, which knows only named host
// tensors and a typed state record. The record (CheckpointInfo) is built here and read back
// here, so the checkpoint's schema lives in checkpoints/checkpoint.h and this file alone.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoints/checkpoint.h"
#include "engine/ema.h"
#include "engine/model.h"
#include "engine/optimizer.h"

namespace spotrain {

// Where training stands: what a checkpoint records of progress, and where a resume goes on.
struct TrainPosition {
  int64_t step = 0;            // steps done (global)
  int64_t epoch = 0;           // the epoch in progress (0-based)
  int64_t batch_in_epoch = 0;  // batches of `epoch` done
};

// What a checkpoint says of the run it belongs to, besides its state.
struct RunIdentity {
  std::string config_json;  // every setting (RunConfig::to_json)
  std::string model, precision;
  uint64_t seed = 0;
  int num_classes = 0, in_channels = 0;
  int64_t global_batch = 0;  // samples per step over all ranks
  int world = 1;             // ranks
};

// The record a checkpoint of `run` at `at` carries, with the loss scaler's state.
CheckpointInfo checkpoint_record(const RunIdentity& run, const TrainPosition& at,
                                 const LossScalerState& scaler);
// Where the run of a checkpoint's record stood.
TrainPosition position_of(const CheckpointInfo& info);
// A position at an epoch's end as the next epoch's start (epoch + 1, batch 0): what a
// checkpoint records, so that its epoch is the count of whole epochs done. (Files written
// before this rule may hold (epoch, batches_per_epoch); a resume reads either.)
TrainPosition settled(const TrainPosition& at, int64_t batches_per_epoch);
// How far training got, as people count it: "6 epochs done", "5 epochs and 120 batches done".
std::string progress_text(const TrainPosition& at);

// Copies the model (and momentum when sgd is given) to host memory: into `params_buf` /
// `momentum_buf` (host, num_params() elements) when given, else into new tensors. Reused
// buffers must not be in use by a write still in flight. Buffers from the backend's
// host_staging_allocator() are filled by DMA while training goes on (see wait_copies).
// The BN statistics come from `bn_stats` (laid out as Model::flat_buffers(): e.g. a copy
// taken at a step's end) when given, else from the model.
CheckpointSnapshot snapshot_checkpoint(Model& model, Sgd* sgd, const CheckpointInfo& info,
                                       Tensor* params_buf = nullptr,
                                       Tensor* momentum_buf = nullptr,
                                       const Tensor* bn_stats = nullptr);
// Bytes a checkpoint of this model takes on disk (parameters, buffers, momentum), roughly.
int64_t checkpoint_bytes(const Model& model, bool with_momentum);
// Loads parameters and BN buffers into `model` (shapes must match; names must all exist), from
// the group "model", or "ema" for the moving average of a run with --ema-decay.
void load_checkpoint_weights(const std::string& path, Model& model, const std::string& group = "model");
// Fine-tuning (--init-from): what of a checkpoint's weights went into a model.
struct MatchedWeights {
  std::string model;                 // the checkpoint's architecture
  int loaded = 0;                    // parameters and BN buffers taken from the file
  std::vector<std::string> skipped;  // the model's others: "fc.weight (shape [1000, 512] there, [10, 512] here)"
  std::vector<std::string> unused;   // the file's tensors no part of the model took
};
// Loads into `model` each parameter and BN buffer of the checkpoint's "model" group whose name
// and shape match; every other one keeps its value. Throws Error when none matches.
MatchedWeights load_matching_weights(const std::string& path, Model& model);
// The moving average as named host tensors (the model's names), for CheckpointSnapshot::ema.
NamedTensors ema_snapshot(Model& model, WeightEma& ema);
// Loads a checkpoint's moving average into `ema`.
void load_ema(const std::string& path, Model& model, WeightEma& ema);
// What verify_checkpoint should find in a checkpoint: every tensor of the model its record
// names (built from the record's model, classes and channels, so an unknown model is refused),
// and with `need_optimizer` the optimizer state a resume reads. `--resume auto` skips a file
// that lacks them, as it skips a corrupt one.
ExpectTensors checkpoint_expectation(bool need_optimizer);
// Refuses a checkpoint (at `path`) whose recorded model this build cannot make, naming the
// file and that the name came from it (not from --model, which the user may never have typed).
void check_recorded_model(const std::string& path, const CheckpointInfo& info);
// Everything needed to continue training exactly: weights, BN buffers, SGD momentum and step
// count; returns the attributes (progress, loss-scaler state).
CheckpointInfo load_training_state(const std::string& path, Model& model, Sgd& sgd);

}  // namespace spotrain
