// Progress (see progress.h).
#include "observe/progress.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/clock.h"
#include "core/log.h"

namespace spotrain {

void Tally::add(const LossResult& l, int64_t batch) {
  images += batch;
  if (!std::isfinite(l.loss)) return;
  loss += l.loss * double(batch);
  correct += l.top1;
  n += batch;
}

void Tally::sum_over(CommWorker& w, const std::string& what, std::vector<double>* extra) {
  std::vector<double> v{loss, double(correct), double(n), double(images), data_wait};
  if (extra) v.insert(v.end(), extra->begin(), extra->end());
  sum_across_ranks(w, v.data(), int(v.size()), what);
  if (extra) std::copy(v.begin() + 5, v.end(), extra->begin());
  loss = v[0];
  correct = int64_t(v[1]);
  n = int64_t(v[2]);
  images = int64_t(v[3]);
  data_wait = v[4];
}

double Tally::mean_loss() const {
  if (n > 0) return loss / double(n);
  return images > 0 ? std::numeric_limits<double>::quiet_NaN() : 0.0;
}

Progress::Progress(CommWorker& worker, MetricsSink& metrics, PrometheusExport* prometheus,
                   const LossScaler& scaler, Allocator& device_memory, Telemetry& telemetry,
                   int log_every, int workers, int64_t epochs, int64_t total_steps,
                   int64_t first_step)
    : worker_(worker),
      metrics_(metrics),
      prometheus_(prometheus),
      scaler_(scaler),
      memory_(device_memory),
      telemetry_(telemetry),
      input_watch_(workers),
      log_every_(log_every),
      epochs_(epochs),
      total_steps_(total_steps),
      first_step_(first_step),
      t_start_(now_seconds()),
      last_step_end_(t_start_) {}

void Progress::start_epoch() {
  window_ = epoch_ = Tally{};
  win_t0_ = epoch_t0_ = now_seconds();
  win_steps_ = 0;
  steady_.restart();  // the epoch's first step holds the loader's restart (and an evaluation)
  if (ranks_) ranks_->skip_next();  // and so for the ranks' own times
}

bool Progress::take_rank_window(RankWatch::Window* out) {
  if (!rank_window_new_) return false;
  rank_window_new_ = false;
  *out = rank_window_;
  return true;
}

namespace {

std::string clock_hms() {  // "07:54:06" (UTC, as the records' times)
  return utc_time_iso().substr(11, 8);
}

}  // namespace

void Progress::step(const StepFacts& s) {
  // Times from when the step was done, not from when its figures came back (a step later).
  const double done = s.done_at > 0 ? s.done_at : now_seconds();
  window_.add(s.loss, s.batch);
  epoch_.add(s.loss, s.batch);
  // The first step of a process waits for the loader to start: not counted as data wait.
  if (s.step > first_step_ + 1) window_.data_wait += s.data_wait;
  if (ranks_) ranks_->add_step(done - last_step_end_, s.data_wait, s.comm_wait, s.device_compute);
  ++win_steps_;
  if (s.phases) {
    phases_ = {{"data", s.data_wait}, {"forward", s.phases->forward}, {"backward", s.phases->backward},
               {"comm_exposed", s.phases->comm_exposed}, {"optimizer", s.phases->optimizer}};
    if (s.phases->captured > 0) phases_["captured_step"] = s.phases->captured;
  }
  if (s.step % log_every_ == 0 || s.step == total_steps_ || s.epoch_end) {
    // The global batch's figures, and each rank's own times in the same all-reduce.
    std::vector<double> rank_slots;
    if (ranks_) rank_slots = ranks_->slots();
    window_.sum_over(worker_, "the logged loss", ranks_ ? &rank_slots : nullptr);
    const double t = done, secs = std::max(1e-9, t - win_t0_);
    const double ranks = double(worker_.comm().size());
    const double ips = double(window_.images) / secs;
    const double step_s = secs / double(win_steps_);
    // The share of the window's time the ranks waited for data (mean over ranks).
    const double wait_share = std::min(1.0, window_.data_wait / ranks / secs);
    // From the steady-state step time, not from the time since start (warm-up, evaluations).
    const double steady = steady_.seconds();
    const int64_t left = total_steps_ - s.step;
    const std::string eta = left <= 0 ? std::string("0s")
                            : steady > 0 ? fmt_duration(steady * double(left))
                                         : std::string("after warm-up");
    const size_t mem = memory_.stats().peak_bytes;
    memory_.reset_peak();
    nlohmann::json tel = telemetry_.sample();
    log_info(str(clock_hms(), " epoch ", s.epoch + 1, "/", epochs_, " step ", s.step, "/", total_steps_,
                 " loss ", fmt_fixed(window_.mean_loss(), 4), " acc ",
                 fmt_fixed(100.0 * window_.accuracy(), 2), "% lr ", fmt_fixed(s.lr, 5), " | ",
                 fmt_fixed(step_s, 3), " s/step, data ", fmt_fixed(100 * wait_share, 1), "%, ",
                 fmt_fixed(ips, 1), " img/s, mem ", fmt_fixed(double(mem) / (1 << 30), 2),
                 " GiB | eta ", eta,
                 scaler_.enabled()
                     ? str(" | scale ", scaler_.scale(), " skipped ", scaler_.state().skipped_steps)
                     : std::string()));
    nlohmann::json record{{"epoch", s.epoch + 1}, {"step", s.step}, {"loss", window_.mean_loss()},
               {"train_top1", window_.accuracy()}, {"lr", s.lr}, {"images_per_sec", ips},
               {"step_seconds", step_s}, {"data_wait_share", wait_share},
               {"memory_bytes", mem}, {"gpu", tel["gpu"]}, {"host", tel["host"]}};
    // null while no steady step time is known yet
    record["eta_seconds"] = steady > 0 || left <= 0 ? nlohmann::json(steady * double(std::max<int64_t>(left, 0)))
                                                    : nlohmann::json(nullptr);
    if (tel.contains("gpu_status")) record["gpu_status"] = tel["gpu_status"];
    if (!phases_.is_null()) record["phases"] = phases_;
    if (scaler_.enabled()) {
      record["loss_scale"] = scaler_.scale();
      record["skipped_steps"] = scaler_.state().skipped_steps;
    }
    if (ranks_) {
      rank_window_ = ranks_->take(rank_slots.data());
      rank_window_new_ = !rank_window_.ranks.empty();
      if (rank_window_new_) record["ranks"] = ranks_->ranks_json(rank_window_);
      if (!rank_window_.stragglers.empty()) record["stragglers"] = ranks_->stragglers_json(rank_window_);
    }
    metrics_.write("step", record);
    if (prometheus_) prometheus_->progress(record);
    for (const Straggler& st : rank_window_new_ ? rank_window_.stragglers : std::vector<Straggler>{}) {
      const int windows = ranks_->streak(st.rank);
      const std::string line = str("straggler: ", ranks_->describe(st), " over steps ", s.step - win_steps_ + 1,
                                   "-", s.step, windows > 1 ? str(" (", windows, " windows in a row)") : std::string());
      log_info(line);
      metrics_.write("warning", {{"kind", "straggler"}, {"step", s.step}, {"rank", st.rank},
                                 {"host", ranks_->hosts()[size_t(st.rank)]}, {"what", st.what},
                                 {"ratio", st.ratio()}, {"windows", windows}, {"message", line}});
    }
    const std::string warning = input_watch_.add(s.step - win_steps_ + 1, s.step,
                                                 window_.data_wait / ranks, secs, telemetry_.sm_util());
    if (!warning.empty()) {
      log_info(warning);
      metrics_.write("warning", {{"kind", "input_bound"}, {"step", s.step},
                                 {"from_step", input_watch_.from_step()},
                                 {"data_wait_share", input_watch_.share()}, {"message", warning}});
    }
    window_ = Tally{};
    win_t0_ = done;
    win_steps_ = 0;
  }
  step_seconds_ = done - last_step_end_;  // the latest step, not the warm-up average
  steady_.add(step_seconds_);
  last_step_end_ = done;
}

Tally Progress::end_epoch(double* seconds) {
  *seconds = now_seconds() - epoch_t0_;
  epoch_.sum_over(worker_, "the epoch summary");  // the whole job's
  return epoch_;
}

}  // namespace spotrain
