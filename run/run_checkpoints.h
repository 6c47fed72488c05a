// A run's checkpoints: when one is due (every N steps, every M minutes, epoch ends, or as
// --ckpt-every auto's Young/Daly interval says from the measured cost), what it records (the
// run's identity and position, engine/checkpoint_state.h), the warm host buffers its snapshot
// is copied into, and the barrier that keeps every rank until a stop's checkpoint is safe.
// Made on every rank; only rank 0 of a run with --ckpt-dir keeps a folder and writes.
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

namespace spotrain {

class RunCheckpoints {
 public:
  // Checks the folder (writable, room for two checkpoints) and touches the snapshot buffers.
  // Every rank calls it (with several ranks and --ckpt-every auto it counts the nodes).
  RunCheckpoints(const RunConfig& cfg, Session& session, Training& t, WeightEma* ema,
                 const io::Dataset& train);
  RunCheckpoints(const RunCheckpoints&) = delete;
  RunCheckpoints& operator=(const RunCheckpoints&) = delete;

  // Where the "checkpoint" records and checkpoint paths go (either may be null).
  void report_to(MetricsSink* metrics, PrometheusExport* prometheus);
  // After a resume that changed the per-rank batch: checkpoints record the new one.
  void set_per_rank_batch(int64_t b) { cfg_.batch_size = b; }

  // Writes a checkpoint of `at` (rank 0): in the background, or with `sync` verified before
  // returning, every rank then waiting at a barrier. The last step is settled first, so the
  // optimizer and loss-scaler state saved match the weights. Returns the path ("" elsewhere).
  std::string write(const TrainPosition& at, bool sync);
  // After each step (every rank calls it; rank 0 acts): reports a finished background write
  // (throws when it failed, unless --on-ckpt-error continue), measures a checkpoint's cost
  // for --ckpt-every auto, and writes a periodic or epoch-end checkpoint when one is due
  // before `total_steps`. Returns the path of one begun now, else "".
  std::string after_step(const TrainPosition& at, bool epoch_end, double step_seconds,
                         int64_t total_steps);
  // What a checkpoint takes to write and verify (0 before the first): the stop policy's
  // margin for --max-wall-time and what a stop costs.
  double seconds() const;

 private:
  void measure_cost(double step_s);
  void set_interval(double stall_s, double write_s);
  CheckpointSnapshot snapshot(const TrainPosition& at);

  RunConfig cfg_;
  Session& session_;
  Training& t_;
  WeightEma* ema_;
  int num_classes_, in_channels_;
  std::unique_ptr<CheckpointManager> manager_;  // rank 0 with a --ckpt-dir
  Tensor snap_params_, snap_momentum_;          // warm host buffers for snapshots
  MetricsSink* metrics_ = nullptr;
  PrometheusExport* prometheus_ = nullptr;
  // --ckpt-every auto (rank 0): the interval from the measured cost of a checkpoint.
  std::optional<AutoCheckpointInterval> auto_;
  int64_t writes_seen_ = 0;                           // writes the interval was set from
  double usual_step_s_ = 0, extra_during_write_ = 0;  // step time without a write; extra with one
  double cost_s_ = 0, write_s_ = 0;                   // a checkpoint's cost to training, its write
  double logged_s_ = 0;                               // the interval last logged
};

}  // namespace spotrain
