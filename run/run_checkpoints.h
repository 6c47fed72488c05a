// A run's checkpoints: when one is due (every N steps, every M minutes, epoch ends, or as
// --ckpt-every auto's Young/Daly interval says from the measured cost), what it records (the
// run's identity and position, engine/checkpoint_state.h), the warm host buffers its snapshot
// is copied into, and the barrier that keeps every rank until a stop's checkpoint is safe.
// Made on every rank; only rank 0 of a run with --ckpt-dir keeps a folder and writes, except
// when a peer is lost: then each surviving rank may save the last step every rank finished
// (--lost-peer-save), one survivor per folder, before the job ends.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "checkpoints/checkpoint_manager.h"
#include "engine/checkpoint_state.h"
#include "engine/data.h"
#include "engine/ema.h"
#include "engine/session.h"
#include "observe/metrics.h"
#include "observe/prometheus.h"
#include "run/ckpt_interval.h"
#include "run/config.h"
#include "run/global_batch.h"
#include "run/storage.h"

namespace spotrain {

class RunCheckpoints {
 public:
  // Checks the folder (writable, room for two checkpoints) and touches the snapshot buffers,
  // on each writer of `storage`. Every rank calls it (with several ranks and --ckpt-every auto
  // it counts the nodes).
  // `split`: the run's global batch and each rank's share of it (run/global_batch.h), which
  // each checkpoint records; it outlives this.
  RunCheckpoints(const RunConfig& cfg, const BatchSplit& split, Session& session, Training& t, WeightEma* ema,
                 const io::Dataset& train, const RunStorage& storage);
  RunCheckpoints(const RunCheckpoints&) = delete;
  RunCheckpoints& operator=(const RunCheckpoints&) = delete;

  // Where the "checkpoint" records and checkpoint paths go (either may be null).
  void report_to(MetricsSink* metrics, PrometheusExport* prometheus);
  // After a resume from `at` (every rank calls it; writers act): a resume from a named file
  // (--resume PATH) moves this writer's checkpoints past it to abandoned-<time>/ (the run
  // goes on from there; a later --resume auto must not jump back onto them); where there are
  // copies, a writer whose folder lacks `at` (a replacement host's empty disk) writes it at
  // once in the background, so the run is held on every disk again before its next checkpoint.
  void after_resume(const TrainPosition& at, bool from_named_file);

  // Writes a checkpoint of `at` (every writer, each into its folder: rank 0 alone where the
  // folder is shared): in the background, or with `sync` verified before returning, every
  // rank then waiting at a barrier. Every rank calls it where there are copies (rank 0 sends
  // its BN statistics). The last step is settled first, so the optimizer and loss-scaler state
  // saved match the weights. Returns the path ("" on a rank that does not write).
  std::string write(const TrainPosition& at, bool sync);
  // Before each step (every rank), with the position after it: where several ranks write
  // copies, rank 0 says whether a checkpoint is due after this step.
  void before_step(const TrainPosition& next, bool epoch_end, int64_t total_steps);
  // After each step (every rank calls it; rank 0 acts): reports a finished background write
  // (throws when it failed, unless --on-ckpt-error continue), measures a checkpoint's cost
  // for --ckpt-every auto (the latest step's seconds against the steady-state step time),
  // and writes a periodic or epoch-end checkpoint when one is due before `total_steps`.
  // Returns the path of one begun now, else "".
  std::string after_step(const TrainPosition& at, bool epoch_end, double step_seconds,
                         double steady_step_seconds, int64_t total_steps);
  // What a checkpoint takes to write and verify (0 before the first): the stop policy's
  // margin for --max-wall-time and what a stop costs.
  double seconds() const;

  // After each step's update is queued, before any other collective: the step every rank
  // finished once this rank's gradient all-reduce of it completed. Its BN statistics are kept
  // (the next forward moves them), so that a survivor saves that step's state exactly.
  void step_done(const TrainPosition& at);
  // A peer is lost (CommWorker::on_lost_peer; no collectives): saves the step step_done last
  // saw into the run folder this rank sees, unless another survivor claimed that step there
  // or it is saved already; within --lost-peer-save seconds, or not at all (a write cut short
  // leaves only a temporary file). Returns what happened, in one line.
  std::string save_on_lost_peer();

 private:
  void measure_cost(double step_s, double steady_s);
  void set_interval(double stall_s, double write_s);
  // The checkpoint of `at`: into the warm buffers (warm) or new ones, with the model's BN
  // statistics or `bn_stats`.
  CheckpointSnapshot snapshot(const TrainPosition& at, bool warm = true, const Tensor* bn_stats = nullptr);

  const RunConfig& cfg_;
  const BatchSplit& split_;
  Session& session_;
  Training& t_;
  WeightEma* ema_;
  int num_classes_, in_channels_;
  RunStorage storage_;
  bool copies_;  // several writers: checkpoints decided by rank 0 before the step
  Tensor bn_rank0_;  // copies: rank 0's BN statistics, broadcast for a checkpoint
  std::unique_ptr<CheckpointManager> manager_;  // each writer with a --ckpt-dir
  Tensor snap_params_, snap_momentum_;          // warm host buffers for snapshots
  MetricsSink* metrics_ = nullptr;
  PrometheusExport* prometheus_ = nullptr;
  // --ckpt-every auto (rank 0): the interval from the measured cost of a checkpoint.
  std::optional<AutoCheckpointInterval> auto_;
  int64_t writes_seen_ = 0;                           // writes the interval was set from
  double extra_during_write_ = 0;  // what the steps beside a write took beyond the steady time
  double cost_s_ = 0, write_s_ = 0;                   // a checkpoint's cost to training, its write
  double logged_s_ = 0;                               // the interval last logged
  // --lost-peer-save (several ranks): the last step every rank finished, its BN statistics.
  bool survive_ = false;
  bool have_done_ = false;
  TrainPosition done_;
  Tensor bn_done_;  // as Model::flat_buffers(), on the device
};

}  // namespace spotrain
