// A run's checkpoint folder, kept by rank 0: checks at start that checkpoints can be written
// there (writable, room for two, no half-written leftovers), decides when one is due (every N
// steps, every M minutes, epoch ends), names and writes them (in the background, or at once
// for a stop), reports finished and failed writes, keeps the newest N, and finds the one to
// resume from. What goes into a checkpoint comes from the caller as a snapshot function.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checkpoints/async_writer.h"
#include "checkpoints/checkpoint.h"

namespace spotrain {

struct CheckpointPolicy {
  std::string dir;            // the run's checkpoint folder
  int keep = 3;               // checkpoints kept (older ones are removed)
  int64_t every_steps = 0;    // also every N steps (0 = no)
  double every_minutes = 0;   // also every M minutes of training (0 = no)
  // A background write that fails (a full disk, a folder gone read-only): false ends the run
  // with an error, true warns and trains on, trying again at the next checkpoint. A write the
  // caller waits for (a stop's, the last) always ends the run when it fails.
  bool continue_on_error = false;
  // Names this writer's temporary files (PATH.TAG.tmp; "" = PATH.tmp), so that two writers
  // that turn out to share a folder never write into the same temporary file.
  std::string writer_tag;
};

// Why a checkpoint write that failed with `what` failed, in a user's words: the folder no
// longer writable, or the disk full (the system's reason in `what` first, else the folder's
// state now: `free_bytes`, `writable`), else `what` itself.
std::string checkpoint_failure_cause(const std::string& what, const std::string& dir,
                                     int64_t free_bytes, bool writable, int64_t bytes_each);

class CheckpointManager {
 public:
  // Prepares `policy.dir` for checkpoints of about `bytes_each` bytes; throws Error when it
  // cannot hold them (not writable, or less free space than two checkpoints).
  CheckpointManager(const CheckpointPolicy& policy, int64_t bytes_each);
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // "DIR/ckpt-00001234.h5"
  std::string path_for(int64_t step) const;
  // Whether a periodic or epoch-end checkpoint is due after `step`.
  bool due(int64_t step, bool epoch_end) const;
  // Writes a checkpoint of `step` from `snapshot()` (called now, at the step boundary): in
  // the background, or with `sync` before returning (verified and published). Returns its path.
  using SnapshotFn = std::function<CheckpointSnapshot()>;
  std::string write(int64_t step, const SnapshotFn& snapshot, bool sync);
  // Reports a background write that finished since the last call; when it failed, throws
  // Error (or warns, with continue_on_error), naming the cause and the newest good checkpoint.
  void poll();
  // True while a background write is in flight.
  bool writing() const { return writer_.busy(); }
  // Checkpoints written (and verified) so far.
  int64_t writes_done() const { return writes_done_; }
  // Changes the every-M-minutes interval (--ckpt-every auto).
  void set_every_minutes(double m) { policy_.every_minutes = m; }
  // Seconds the latest snapshot held training, and the latest write took (0 before the first).
  double last_snapshot_seconds() const { return snapshot_seconds_; }
  double last_write_seconds() const { return writer_.last_write_seconds(); }
  // Writes DIR/classes.txt: line i names label i.
  void write_class_names(const std::vector<std::string>& names) const;

 private:
  void check_folder(int64_t bytes_each);
  // A failed write of `path`: why (the folder full or read-only, else `e`), what is still safe.
  std::string failure(const std::string& path, const std::exception& e) const;
  CheckpointPolicy policy_;
  int64_t bytes_each_;
  AsyncCheckpointWriter writer_;
  std::string writing_;  // path of the write in flight
  double last_time_;     // when the latest checkpoint was written (or the manager made)
  double snapshot_seconds_ = 0;
  int64_t writes_done_ = 0;
};

}  // namespace spotrain
