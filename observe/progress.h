// Progress of a training run: the loss and accuracy tallied per progress window and per
// epoch (summed over ranks when reported); the progress line every --log-every steps and at
// epoch ends (wall-clock time, step time, the share of it spent waiting for data, images/s,
// memory in use, the ETA from the steady-state step time (steady_steps.h), fp16's loss scale)
// and, with several ranks, the stragglers among them (rank_watch.h);
// its record with the machine's telemetry and one step's phase times, written to the metrics and handed to the --prometheus file; the
// input-bound check; and the step time the stop policy needs.
#pragma once
#include <cstdint>
#include <string>

#include <optional>

#include <nlohmann/json.hpp>

#include "comm/comm_worker.h"
#include "core/allocator.h"
#include "observe/input_watch.h"
#include "observe/steady_steps.h"
#include "engine/loss_scaler.h"
#include "observe/metrics.h"
#include "observe/prometheus.h"
#include "observe/rank_watch.h"
#include "engine/step.h"
#include "observe/telemetry.h"
#include "kernels/ops.h"

namespace spotrain {

// Loss and accuracy summed over the steps of a progress window or an epoch. A step whose
// loss is not finite (only an fp16 step skipped for an overflow in its forward gets this far)
// counts in `images` but not in the loss and accuracy: one such step would make a whole
// window's loss NaN. When every step of a window was such a step, the loss is NaN.
struct Tally {
  double loss = 0;  // sum of per-sample losses
  int64_t correct = 0, n = 0;  // over the samples of steps with a finite loss
  int64_t images = 0;          // every sample trained on (throughput)
  double data_wait = 0;  // seconds spent waiting for batches (summed over ranks when reported)
  void add(const LossResult& l, int64_t batch);
  // The whole job's figures (sums over ranks).
  // `extra`, when given, is summed in the same all-reduce (RankWatch's slots).
  void sum_over(CommWorker& w, const std::string& what, std::vector<double>* extra = nullptr);
  double mean_loss() const;
  double accuracy() const { return n ? double(correct) / double(n) : 0; }
};

// What the trainer saw of one step.
struct StepFacts {
  int64_t step = 0, epoch = 0;  // step 1-based, epoch 0-based
  float lr = 0;
  LossResult loss;
  int64_t batch = 0;
  bool epoch_end = false;         // the epoch's last batch
  double data_wait = 0;           // seconds this rank waited for the batch
  double comm_wait = 0;           // seconds it waited for the ranks' gradient sum (StepResult)
  double device_compute = -1;     // its forward and backward on the device's clock (-1: none)
  const StepTimes* phases = nullptr;  // the step's phases, when it was timed (due_for_phases)
  double done_at = 0;  // when the step was done (StepResult::done_at; 0: now)
};

class Progress {
 public:
  // device_memory: the compute device's allocator (its peak per window is reported);
  // telemetry: sampled with each progress line (every rank samples its own machine);
  // prometheus: where the records go besides the metrics (null: nowhere).
  Progress(CommWorker& worker, MetricsSink& metrics, PrometheusExport* prometheus,
           const LossScaler& scaler, Allocator& device_memory, Telemetry& telemetry, int log_every,
           int workers, int64_t epochs, int64_t total_steps, int64_t first_step);
  void start_epoch();
  // Whether step (1-based) should be timed phase by phase (one step per progress window: the
  // phase timing synchronizes a GPU between phases).
  bool due_for_phases(int64_t step) const { return step % log_every_ == 0; }
  // After a step. When its progress line is due: prints it and writes its record (every rank
  // makes it, with the job's figures and its own telemetry; rank 0's metrics and each node's
  // Prometheus file take it).
  void step(const StepFacts& s);
  // The latest step's seconds (what a checkpoint write costs the steps beside it is measured
  // on these), and the steady-state step time every estimate uses (0 while warming up).
  double last_step_seconds() const { return step_seconds_; }
  double steady_step_seconds() const { return steady_.seconds(); }
  // The epoch's figures over all ranks, and its seconds.
  Tally end_epoch(double* seconds);
  // With several ranks: each rank's times per step gathered at every progress line, the
  // stragglers named there (observe/rank_watch.h). `w` outlives the Progress.
  void watch_ranks(RankWatch* w) { ranks_ = w; }
  // The window the latest progress line gathered, once (false when none came since the last
  // call): where the trainer weighs leaving a straggler behind.
  bool take_rank_window(RankWatch::Window* out);

 private:
  CommWorker& worker_;
  MetricsSink& metrics_;
  PrometheusExport* prometheus_;
  const LossScaler& scaler_;
  Allocator& memory_;
  Telemetry& telemetry_;
  InputWatch input_watch_;
  int log_every_;
  int64_t epochs_, total_steps_, first_step_;
  Tally window_, epoch_;
  int64_t win_steps_ = 0;  // steps in the current window
  double t_start_, win_t0_ = 0, epoch_t0_ = 0, last_step_end_, step_seconds_ = 0;
  nlohmann::json phases_;  // the latest timed step's phases
  SteadySteps steady_;
  RankWatch* ranks_ = nullptr;
  RankWatch::Window rank_window_;
  bool rank_window_new_ = false;
};

}  // namespace spotrain
