// The training loop: next batch -> step -> progress -> checkpoint or stop, epoch by epoch,
// with evaluation after epochs. What it runs lives beside it: the parts a rank builds
// (run/setup.h, engine/session.h), one step (engine/step.h), resume (run/resume.h), the run's
// checkpoints (run/run_checkpoints.h), stopping (run/stop_policy.h), the run folder
// (run/run_folder.h), and what reports on the run (observe/).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "engine/data.h"
#include "engine/ema.h"
#include "engine/evaluate.h"
#include "engine/lr_schedule.h"
#include "engine/session.h"
#include "io/loader.h"
#include "observe/metrics.h"
#include "observe/prometheus.h"
#include "observe/rank_watch.h"
#include "observe/telemetry.h"
#include "run/config.h"
#include "run/global_batch.h"
#include "run/leave_rule.h"
#include "run/resume.h"
#include "run/run_checkpoints.h"
#include "run/run_folder.h"
#include "run/storage.h"
#include "spot/preempt_notice.h"

namespace spotrain {

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
  // Builds the rank's parts in the order their inputs are known: the session, the data, the
  // run folder, where training starts (run/resume.h: the checkpoint found decides the batch
  // split), then the model, step runner and checkpoint writer from that split, and the state:
  // the checkpoint's, else fresh weights or --init-from's.
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
  const BatchSplit& batch_split() const { return split_; }

 private:
  // The run's length and learning-rate schedule, from the loader's steps per epoch.
  struct Schedule {
    int64_t per_epoch = 0, total_steps = 0, epochs = 0;
    LrSchedule lr;
  };
  struct Loop;  // what one run() keeps between steps (trainer.cpp)
  Schedule schedule(int64_t per_epoch) const;
  void log_start(const Schedule& s);
  // Before the first step: the resume's records, the start lines, the rank watch.
  void begin(Loop& loop);
  // Why the shares of the global batch cannot follow the ranks' rates ("" where they can).
  std::string why_shares_stay() const;
  // The first shares: by the health gate's rates where it measured every rank's host.
  void seed_shares();
  // Queues the step of batch `b` (the next after `at`; with several micro-batches per step its
  // first, the others taken from `loader` as they are queued) and hands the figures read back
  // so far to the progress line; returns the position after it.
  TrainPosition step(Loop& loop, io::Loader& loader, io::Batch& b, int64_t epoch, double data_wait,
                     TrainPosition at);
  // After a step: the reason to stop now ("" = train on): a stop signal, notice or
  // --max-wall-time (run/stop_policy.h), or a straggler's host to leave behind; and after a
  // progress window, the shares of the global batch that follow the ranks' rates.
  std::string after_step(Loop& loop, io::Loader& loader, const TrainPosition& at);
  // From the step after `at`: `next` is the split, in the step runner, the loader, the rank
  // watch and the checkpoints alike (every rank calls it at the same step).
  void reshare(Loop& loop, io::Loader& loader, const TrainPosition& at, const BatchSplit& next);
  void end_epoch(Loop& loop, int64_t epoch, bool last_epoch, int64_t step, TrainResult& res);
  // A stop (signal, notice, --max-wall-time) after `at`: a checkpoint, then exit 75.
  TrainResult stop_early(Loop& loop, const TrainPosition& at, const std::string& why, TrainResult res);
  // After the last step: the final checkpoint and the end record.
  TrainResult finish(Loop& loop, io::Loader& loader, const TrainPosition& at, TrainResult res);
  void report_bad_images(io::Loader& loader, TrainResult& res);
  // After a step whose progress line gathered the ranks' times `w`: the reason to stop and
  // leave a straggler's host behind ("" = train on; run/leave_rule.h).
  std::string weigh_stragglers(Loop& loop, const RankWatch::Window& w, int64_t step);

  const RunConfig cfg_;  // as given and validated: never changed once the run starts
  double created_ = 0;   // when the Trainer was made: --max-wall-time counts from here
  std::unique_ptr<Session> session_;
  DataPair data_;
  RunStorage storage_;                 // where the checkpoints are kept (--ckpt-dir)
  std::unique_ptr<RunFolder> folder_;  // each writer of a copy (rank 0 where shared)
  std::vector<std::string> hosts_;     // every rank's host (comm/hosts.h; several ranks)
  ResumePoint start_;                  // where training starts (found by the constructor)
  // The global batch and each rank's micro-batches of it (run/global_batch.h): decided before
  // the parts below are built (a checkpoint of another rank count keeps its global batch); its
  // shares move only at a step every rank agrees on (reshare).
  BatchSplit split_;
  Training t_;
  std::unique_ptr<WeightEma> ema_;  // --ema-decay
  std::unique_ptr<RunCheckpoints> checkpoints_;
  std::unique_ptr<MetricsSink> metrics_;
  std::unique_ptr<Telemetry> telemetry_;        // every rank: its own GPU and host
  std::unique_ptr<PrometheusExport> prom_;      // --prometheus, the first rank of each node
  std::unique_ptr<PreemptionWatcher> notices_;  // --preempt-notice, on every rank
  FILE* sample_log_ = nullptr;                  // SPOTRAIN_SAMPLE_LOG test hook
};

}  // namespace spotrain
