// The training loop: next batch -> step -> progress and metrics -> checkpoint or stop, epoch
// by epoch, with evaluation after epochs. The pieces it runs live in their own files: the
// rank's set-up (session.h), one step (step.h), stopping (stop_policy.h), the checkpoint
// folder (checkpoints/checkpoint_manager.h), metrics (metrics.h), evaluation (evaluate.h).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "checkpoints/checkpoint_manager.h"
#include "spot/preempt_notice.h"
#include "run/ckpt_interval.h"
#include "run/config.h"
#include "engine/data.h"
#include "engine/ema.h"
#include "engine/evaluate.h"
#include "engine/lr_schedule.h"
#include "observe/metrics.h"
#include "observe/prometheus.h"
#include "run/run_folder.h"
#include "engine/session.h"
#include "observe/telemetry.h"
#include "io/loader.h"

namespace spotrain {

class Progress;

struct TrainResult {
  int64_t steps = 0;
  double final_loss = 0, train_top1 = 0;
  EvalResult test;
  EvalResult ema_test;  // --ema-decay: the moving average's figures
  double images_per_sec = 0;
  double seconds = 0;
  int64_t skipped_steps = 0;  // fp16 overflows
  double loss_scale = 1;
  std::string checkpoint;  // path of the last checkpoint written ("" = none)
  int64_t bad_images = 0;  // unreadable training images skipped (this rank)
  bool stopped = false;    // stopped early by a signal after writing a checkpoint (exit 75)
};

class Trainer {
 public:
  explicit Trainer(const RunConfig& cfg);
  ~Trainer();
  TrainResult run();
  EvalResult evaluate(const io::Dataset& data, int64_t batch_size);
  Model& model() { return *t_.model; }
  WeightEma* ema() { return ema_.get(); }
  Backend& backend() { return session_->backend(); }
  Sgd& optimizer() { return *t_.sgd; }
  LossScaler& scaler() { return *t_.scaler; }
  Communicator& comm() { return session_->comm(); }

 private:
  // Where training continues: after --resume, the step and the position in the data.
  struct Position {
    int64_t step = 0, epoch = 0, batch_in_epoch = 0;
  };
  void check_ranks_agree();
  // Rank 0 finds and loads the checkpoint and broadcasts the state to every rank (other
  // nodes need no copy of the file). A checkpoint from another rank count keeps its global
  // batch: the per-rank --batch-size becomes global / world.
  Position resume();
  // Writes ckpt-<step>.h5 (rank 0): in the background, or with `sync` before returning
  // (every rank then waits at a barrier). Returns the path.
  std::string write_checkpoint(const Position& at, bool sync);
  // The run's length and learning-rate schedule, from the loader's batches per epoch.
  struct Plan {
    int64_t per_epoch = 0, total_steps = 0, epochs = 0;
    LrSchedule lr;
  };
  Plan plan(int64_t per_epoch) const;
  io::LoaderOptions loader_options() const;
  void log_start(const Plan& p);
  void step_hooks(int64_t step, const io::Batch& b);
  double checkpoint_seconds() const;
  void measure_checkpoint_cost(double step_s);
  void set_auto_interval(double stall_s, double write_s);
  void end_epoch(int64_t epoch, bool last_epoch, Progress& progress, const Plan& p, int64_t step,
                 TrainResult& res);
  void report_bad_images(io::Loader& loader, TrainResult& res);
  // --prometheus: the node's file from a progress record; running = false at the stop or end.
  void publish(const nlohmann::json& record, bool running);

  RunConfig cfg_;
  double created_ = 0;  // when the Trainer was made: --max-wall-time counts from here
  std::unique_ptr<Session> session_;
  DataPair data_;
  Training t_;
  std::unique_ptr<RunFolder> folder_;        // rank 0 with a --ckpt-dir
  std::unique_ptr<CheckpointManager> ckpt_;  // rank 0 with a --ckpt-dir
  Tensor snap_params_, snap_momentum_;       // warm host buffers for snapshots
  std::optional<AutoCheckpointInterval> auto_interval_;  // --ckpt-every auto (rank 0)
  int64_t writes_seen_ = 0;                  // checkpoint writes its interval was set from
  double usual_step_s_ = 0, extra_during_write_ = 0;  // step time without a write; extra with one
  double cost_s_ = 0, write_s_ = 0;          // a checkpoint's cost to training, its write time
  double auto_logged_s_ = 0;                 // the interval last logged
  std::unique_ptr<WeightEma> ema_;           // --ema-decay
  std::unique_ptr<MetricsSink> metrics_;
  std::unique_ptr<Telemetry> telemetry_;      // every rank: its own GPU and host
  std::unique_ptr<PrometheusFile> prom_;      // --prometheus, the first rank of each node
  nlohmann::json last_record_;                // the latest progress record (for prom_)
  std::string ckpt_started_, ckpt_done_;      // newest checkpoint begun, and known written
  std::unique_ptr<PreemptionWatcher> notices_;  // --preempt-notice, on every rank
  FILE* sample_log_ = nullptr;  // SPOTRAIN_SAMPLE_LOG test hook
  FILE* log_file_ = nullptr;    // the run folder's train.log (rank 0)
};

}  // namespace spotrain
