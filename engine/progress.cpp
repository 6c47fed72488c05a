// Progress (see progress.h).
#include "engine/progress.h"

#include <algorithm>

#include "engine/core/clock.h"
#include "engine/core/log.h"
#include "engine/evaluate.h"

namespace spotrain {

void Tally::add(const LossResult& l, int64_t batch) {
  loss += l.loss * double(batch);
  correct += l.top1;
  n += batch;
}

void Tally::sum_over(CommWorker& w, const std::string& what) {
  double v[3] = {loss, double(correct), double(n)};
  sum_across_ranks(w, v, 3, what);
  loss = v[0];
  correct = int64_t(v[1]);
  n = int64_t(v[2]);
}

Progress::Progress(CommWorker& worker, MetricsSink& metrics, const LossScaler& scaler,
                   int log_every, int64_t epochs, int64_t total_steps, int64_t first_step)
    : worker_(worker),
      metrics_(metrics),
      scaler_(scaler),
      log_every_(log_every),
      epochs_(epochs),
      total_steps_(total_steps),
      first_step_(first_step),
      t_start_(now_seconds()),
      last_step_end_(t_start_) {}

void Progress::start_epoch() {
  window_ = epoch_ = Tally{};
  win_t0_ = epoch_t0_ = now_seconds();
}

void Progress::step(int64_t step, int64_t epoch, float lr, const LossResult& loss, int64_t batch,
                    bool epoch_end) {
  window_.add(loss, batch);
  epoch_.add(loss, batch);
  if (step % log_every_ == 0 || step == total_steps_ || epoch_end) {
    window_.sum_over(worker_, "the logged loss");  // the global batch's figures
    const double t = now_seconds();
    const double ips = double(window_.n) / std::max(1e-9, t - win_t0_);
    const double eta = (t - t_start_) / double(step - first_step_) * double(total_steps_ - step);
    log_info(str("epoch ", epoch + 1, "/", epochs_, " step ", step, "/", total_steps_, " loss ",
                 fmt_fixed(window_.mean_loss(), 4), " acc ", fmt_fixed(100.0 * window_.accuracy(), 2),
                 "% lr ", fmt_fixed(lr, 5), " img/s ", fmt_fixed(ips, 1), " eta ", fmt_duration(eta),
                 scaler_.enabled()
                     ? str(" scale ", scaler_.scale(), " skipped ", scaler_.state().skipped_steps)
                     : std::string()));
    nlohmann::json j{{"epoch", epoch + 1}, {"step", step}, {"loss", window_.mean_loss()},
                     {"train_top1", window_.accuracy()}, {"lr", lr}, {"images_per_sec", ips}};
    if (scaler_.enabled()) {
      j["loss_scale"] = scaler_.scale();
      j["skipped_steps"] = scaler_.state().skipped_steps;
    }
    metrics_.write("step", j);
    window_ = Tally{};
    win_t0_ = now_seconds();
  }
  const double end = now_seconds();
  step_seconds_ = end - last_step_end_;  // the latest step, not the warm-up average
  last_step_end_ = end;
}

Tally Progress::end_epoch(double* seconds) {
  *seconds = now_seconds() - epoch_t0_;
  epoch_.sum_over(worker_, "the epoch summary");  // the whole job's
  return epoch_;
}

}  // namespace spotrain
