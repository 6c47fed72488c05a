// HDF5 checkpoints: one file per checkpoint, readable with h5dump/h5py, parameters and BN
// buffers named the torchvision way under /model, SGD momentum under /optimizer/momentum,
// the run config (JSON) and the format version as attributes. Written to `PATH.tmp`,
// flushed, fsynced and renamed, so a crash mid-write never leaves a half file at PATH.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "checkpoints/training_record.h"
#include "core/tensor.h"

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
  int64_t optimizer_steps = -1;  // the optimizer's step count (-1: no optimizer state)
  std::string optimizer_kind = "sgd";  // /optimizer's `kind`: "sgd" or "lars" (--optimizer)
};

// Host tensors with their checkpoint names (torchvision's: "layer1.0.conv1.weight").
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Everything a checkpoint holds, copied to host memory at a step boundary, so a background
// thread can write it while training goes on.
struct CheckpointSnapshot {
  CheckpointInfo info;
  NamedTensors model;         // host fp32: parameters, then BN buffers
  NamedTensors momentum;      // per parameter (empty without optimizer state)
  NamedTensors ema;           // --ema-decay: the averaged parameters and BN buffers (empty: none)
  OptimizerRecord optimizer;  // steps < 0: no optimizer state
  // Waits for device-to-host copies still in flight into the tensors above (a GPU's
  // snapshot into pinned buffers returns before its DMA is done); write_checkpoint_file
  // calls it first.
  std::function<void()> wait_copies;
};
// Writes a snapshot to `path` atomically: to PATH.tmp (or `tmp` when given), fsync, read back
// and verified whole, then renamed and the directory fsynced. Throws, leaving no file, when any
// of it fails.
void write_checkpoint_file(const std::string& path, const CheckpointSnapshot& snap,
                           const std::string& tmp = "");
// "DIR/ckpt-00001234.h5": the name of the checkpoint of `step` in `dir`.
std::string checkpoint_path(const std::string& dir, int64_t step);
// Bytes a checkpoint of `elements` fp32 values takes on disk, roughly (with metadata).
inline int64_t checkpoint_bytes(int64_t elements) { return elements * 4 + (int64_t(1) << 20); }
// Reads the attributes only. Throws Error naming the file when it is not a readable checkpoint.
CheckpointInfo read_checkpoint_info(const std::string& path);
// Reads the tensors of `group` ("model" or "optimizer/momentum") named in `into` into its
// host fp32 tensors, checking each one's shape and CRC-32; throws Error naming the file and
// the tensor when one is missing, of another shape or corrupt.
void read_checkpoint_tensors(const std::string& path, const std::string& group, NamedTensors& into);
// The name and shape of every tensor of `group` ("model"), without reading them; throws Error
// when the file is not a readable checkpoint or has no such group.
std::map<std::string, Shape> checkpoint_tensor_shapes(const std::string& path, const std::string& group);
// Whether the checkpoint holds the group ("ema", "optimizer/momentum").
bool checkpoint_has_group(const std::string& path, const std::string& group);
// What reading a checkpoint back will need of it: the model tensors' names and shapes
// (parameters and BN buffers) and, to resume training, the optimizer's momentum per parameter.
// The layers above know the model (engine/checkpoint_state.h: checkpoint_expectation).
struct ExpectedTensors {
  std::vector<std::pair<std::string, Shape>> model, momentum;
  bool need_optimizer = false;
};
using ExpectTensors = std::function<ExpectedTensors(const CheckpointInfo&)>;
// Reads every tensor and checks its CRC-32, the format version and the attributes (each in
// range), that the file is self-contained (no external links or storage) and, with `expect`,
// that it holds every tensor its model needs at its shape; throws Error saying what is wrong.
// Fills `info` when given.
void verify_checkpoint(const std::string& path, CheckpointInfo* info, const ExpectTensors& expect = {});
// The ckpt-*.h5 files in `dir`, newest (highest step) first.
std::vector<std::string> list_checkpoints(const std::string& dir);
// The checkpoint to continue from in `dir`: the newest that verifies (`latest` may not name it
// yet where several write the folder); unusable ones are reported on stderr and skipped ("" when
// none is good).
// With `expect`, "verifies" includes holding what that expectation needs, so a file that a
// resume would refuse is skipped like a corrupt one. `skipped` (when given) receives why each
// skipped file was refused, newest first: a caller that then finds none names the reason.
std::string newest_good_checkpoint(const std::string& dir, const ExpectTensors& expect = {},
                                   std::vector<std::string>* skipped = nullptr);
// "; N unusable checkpoint(s) skipped, the newest: WHY" for the reasons newest_good_checkpoint
// gave ("" for none): the end of the error line that says no checkpoint was good.
std::string skipped_checkpoints_text(const std::vector<std::string>& skipped);
// Moves the checkpoints of `dir` past `step` into `dir`/`to` (made when needed), oldest
// last; returns how many moved. Throws Error when one cannot be moved.
int move_checkpoints_after(const std::string& dir, int64_t step, const std::string& to);
// After a save (write_checkpoint_file verified it): atomically points `latest` at it (unless
// `latest` names a newer checkpoint that exists: two writers of one folder never move it back),
// then removes all but the newest `keep` checkpoints (never the new one).
void finish_checkpoint(const std::string& path, int keep);

}  // namespace spotrain
