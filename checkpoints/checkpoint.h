// HDF5 checkpoints: one file per checkpoint, readable with h5dump/h5py, parameters and BN
// buffers named the torchvision way under /model, SGD momentum under /optimizer/momentum,
// the run config (JSON) and the format version as attributes. Written to `PATH.tmp`,
// flushed, fsynced and renamed, so a crash mid-write never leaves a half file at PATH.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/loss_scaler.h"
#include "engine/model.h"
#include "engine/optimizer.h"

namespace spotrain {

constexpr int kCheckpointFormatVersion = 1;

struct CheckpointInfo {
  int format_version = 0;
  std::string config_json;  // the RunConfig the checkpoint was trained with
  std::string model;        // architecture name
  int64_t epoch = 0, global_step = 0;
  int64_t batch_in_epoch = 0;  // batches of `epoch` already trained (resume continues there)
  int num_classes = 0, in_channels = 0;
  std::string precision = "fp32";
  LossScalerState scaler;  // fp16 loss-scaling state (scale 1 otherwise)
  // Data progress for an exact (and elastic) resume; 0 in files that predate them.
  int64_t global_batch = 0;  // samples per step over all ranks
  int world_size = 0;        // ranks the checkpoint was trained on
  int64_t samples_in_epoch = 0;  // = batch_in_epoch * global_batch
  uint64_t seed = 0;
};

// Everything a checkpoint holds, copied to host memory at a step boundary, so a background
// thread can write it while training goes on.
struct CheckpointSnapshot {
  CheckpointInfo info;
  std::vector<std::pair<std::string, Tensor>> model;     // parameters, then BN buffers
  std::vector<std::pair<std::string, Tensor>> momentum;  // per parameter (none without sgd)
  int64_t sgd_steps = -1;                                // -1: no optimizer state
  SgdOptions sgd;                                        // hyper-parameters (attributes)
  // Waits for device-to-host copies still in flight into the tensors above (a GPU's
  // snapshot into pinned buffers returns before its DMA is done); write_checkpoint_file
  // calls it first.
  std::function<void()> wait_copies;
};
// Copies the model (and momentum when sgd is given) to host memory: into `params_buf` /
// `momentum_buf` (host, num_params() elements) when given, else into new tensors. Reused
// buffers must not be in use by a write still in flight. Buffers from the backend's
// host_staging_allocator() are filled by DMA while training goes on (see wait_copies).
CheckpointSnapshot snapshot_checkpoint(Model& model, Sgd* sgd, const CheckpointInfo& info,
                                       Tensor* params_buf = nullptr,
                                       Tensor* momentum_buf = nullptr);
// Writes a snapshot to `path` atomically (PATH.tmp, fsync, rename, fsync of the directory).
void write_checkpoint_file(const std::string& path, const CheckpointSnapshot& snap);
// snapshot_checkpoint + write_checkpoint_file.
void save_checkpoint(const std::string& path, Model& model, Sgd* sgd, const CheckpointInfo& info);
// Bytes a checkpoint of this model takes on disk (parameters, buffers, momentum), roughly.
int64_t checkpoint_bytes(Model& model, bool with_momentum);
// Reads the attributes only. Throws Error naming the file when it is not a readable checkpoint.
CheckpointInfo read_checkpoint_info(const std::string& path);
// Loads parameters and BN buffers into `model` (shapes must match; names must all exist).
void load_checkpoint_weights(const std::string& path, Model& model);
// Everything needed to continue training exactly: weights, BN buffers, SGD momentum and step
// count; returns the attributes (progress, loss-scaler state).
CheckpointInfo load_training_state(const std::string& path, Model& model, Sgd& sgd);
// The newest ckpt-*.h5 in `dir` ("" when there is none).
std::string newest_checkpoint(const std::string& dir);
// Reads every tensor and checks its CRC-32, the format version and the attributes; throws
// Error saying what is wrong. Fills `info` when given.
void verify_checkpoint(const std::string& path, CheckpointInfo* info);
// The newest checkpoint in `dir` that verifies; unusable newer ones are reported on stderr
// and skipped ("" when none is good).
std::string newest_good_checkpoint(const std::string& dir);
// After a save: verifies the new file, then atomically points `latest` at it, then removes
// all but the newest `keep` checkpoints (never the new one).
void finish_checkpoint(const std::string& path, int keep);

}  // namespace spotrain
