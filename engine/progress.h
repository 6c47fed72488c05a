// Progress of a training run: the loss and accuracy tallied per progress window and per
// epoch (summed over ranks when reported), the progress line every --log-every steps and at
// epoch ends with images/s and the ETA, its metrics record, and the step time the stop policy
// needs.
#pragma once
#include <cstdint>
#include <string>

#include "comm/comm_worker.h"
#include "engine/loss_scaler.h"
#include "engine/metrics.h"
#include "kernels/ops.h"

namespace spotrain {

// Loss and accuracy summed over the steps of a progress window or an epoch.
struct Tally {
  double loss = 0;  // sum of per-sample losses
  int64_t correct = 0, n = 0;
  void add(const LossResult& l, int64_t batch);
  // The whole job's figures (sums over ranks).
  void sum_over(CommWorker& w, const std::string& what);
  double mean_loss() const { return n ? loss / double(n) : 0; }
  double accuracy() const { return n ? double(correct) / double(n) : 0; }
};

class Progress {
 public:
  Progress(CommWorker& worker, MetricsSink& metrics, const LossScaler& scaler, int log_every,
           int64_t epochs, int64_t total_steps, int64_t first_step);
  void start_epoch();
  // After `step` (1-based) of `epoch` (0-based) with learning rate lr; `epoch_end`: the
  // epoch's last batch. Prints the progress line when due.
  void step(int64_t step, int64_t epoch, float lr, const LossResult& loss, int64_t batch,
            bool epoch_end);
  double last_step_seconds() const { return step_seconds_; }
  // The epoch's figures over all ranks, and its seconds.
  Tally end_epoch(double* seconds);

 private:
  CommWorker& worker_;
  MetricsSink& metrics_;
  const LossScaler& scaler_;
  int log_every_;
  int64_t epochs_, total_steps_, first_step_;
  Tally window_, epoch_;
  double t_start_, win_t0_ = 0, epoch_t0_ = 0, last_step_end_, step_seconds_ = 0;
};

}  // namespace spotrain
