// RunCheckpoints (see run_checkpoints.h).
#include "run/run_checkpoints.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"

namespace spotrain {

RunCheckpoints::RunCheckpoints(const RunConfig& cfg, Session& session, Training& t, WeightEma* ema,
                               const io::Dataset& train)
    : cfg_(cfg),
      session_(session),
      t_(t),
      ema_(ema),
      num_classes_(train.num_classes()),
      in_channels_(train.image_shape().c) {
  int hosts = 1;  // nodes: ranks that are the first on theirs
  if (session.world() > 1 && cfg.ckpt_every == "auto") {
    std::vector<uint64_t> local;
    session.worker().run("count of nodes", [&] { local = session.comm().allgather(session.comm().local_rank()); });
    hosts = int(std::count(local.begin(), local.end(), uint64_t(0)));
  }
  if (cfg.ckpt_dir.empty() || session.rank() != 0) return;
  CheckpointPolicy policy{cfg.ckpt_dir, cfg.keep, cfg.ckpt_every_steps(), cfg.ckpt_every_min,
                          cfg.on_ckpt_error == "continue"};
  Model& model = *t.model;
  const int64_t bytes = checkpoint_bytes(model, true) + (ema ? checkpoint_bytes(model, false) : 0);
  manager_ = std::make_unique<CheckpointManager>(policy, bytes);
  // Snapshot buffers, touched now, so a checkpoint mid-training copies into warm pages
  // (faulting in a fresh ResNet-50-sized buffer costs ~0.5 s on a small machine); pinned
  // on a GPU, so a checkpoint's copy is one DMA that training does not wait for.
  Allocator& staging = session.backend().host_staging_allocator();
  snap_params_ = Tensor({model.num_params()}, DType::f32, staging);
  snap_momentum_ = Tensor({model.num_params()}, DType::f32, staging);
  const double t0 = now_seconds();
  std::memset(snap_params_.raw(), 0, snap_params_.nbytes());
  std::memset(snap_momentum_.raw(), 0, snap_momentum_.nbytes());
  const double touch_seconds = now_seconds() - t0;
  manager_->write_class_names(train.class_names());
  if (cfg.ckpt_every == "auto") {
    // Until a checkpoint has been measured: a stall of about the buffers' first touch.
    auto_ = AutoCheckpointInterval{parse_duration(cfg.mtbf), hosts};
    set_interval(touch_seconds, 0);
  }
}

void RunCheckpoints::report_to(MetricsSink* metrics, PrometheusExport* prometheus) {
  metrics_ = metrics;
  prometheus_ = prometheus;
}

CheckpointSnapshot RunCheckpoints::snapshot(const TrainPosition& at) {
  RunIdentity run;
  run.config_json = cfg_.to_json();
  run.model = cfg_.model;
  run.precision = cfg_.precision;
  run.seed = cfg_.seed;
  run.num_classes = num_classes_;
  run.in_channels = in_channels_;
  run.world = session_.world();
  run.global_batch = cfg_.batch_size * run.world;
  const CheckpointInfo info = checkpoint_record(run, at, t_.scaler->state());
  // Rank 0's BN statistics are saved (as every rank loads them on resume).
  CheckpointSnapshot s = snapshot_checkpoint(*t_.model, t_.sgd.get(), info, &snap_params_, &snap_momentum_);
  if (ema_) s.ema = ema_snapshot(*t_.model, *ema_);
  return s;
}

std::string RunCheckpoints::write(const TrainPosition& at, bool sync) {
  t_.runner->settle();  // a step that went wrong throws here, before anything is written
  std::string path;
  if (manager_) {
    path = manager_->write(at.step, [&] { return snapshot(at); }, sync);
    if (!path.empty()) {
      if (prometheus_) prometheus_->checkpoint(path, sync);
      if (metrics_) metrics_->write("checkpoint", {{"step", at.step}, {"path", path}, {"background", !sync}});
    }
  }
  if (sync && session_.world() > 1)  // nobody exits before rank 0's file is safe
    session_.worker().run("barrier after the checkpoint", [&] { session_.comm().barrier(); });
  return path;
}

std::string RunCheckpoints::after_step(const TrainPosition& at, bool epoch_end, double step_seconds,
                                       int64_t total_steps) {
  if (!manager_) return "";
  manager_->poll();
  if (auto_) measure_cost(step_seconds);
  if (at.step >= total_steps || !manager_->due(at.step, epoch_end)) return "";
  // Rank 0 alone decides and writes in the background (write settles the step; its figures
  // reach the progress line with the next).
  return write(at, /*sync=*/false);
}

double RunCheckpoints::seconds() const {
  if (!manager_ || manager_->last_write_seconds() <= 0) return 0.0;
  return manager_->last_snapshot_seconds() + manager_->last_write_seconds();
}

// --ckpt-every auto: what a background checkpoint costs training is the stall for the state
// copy plus what the write takes from the steps it runs beside (on a CPU, cores; on a GPU,
// little): the steps during a write are compared with the usual step time. The interval
// follows the cost, smoothed over checkpoints.
void RunCheckpoints::measure_cost(double step_s) {
  if (manager_->writing()) {
    if (usual_step_s_ > 0) extra_during_write_ += std::max(0.0, step_s - usual_step_s_);
    return;
  }
  if (manager_->writes_done() == writes_seen_) {  // an ordinary step
    usual_step_s_ = usual_step_s_ > 0 ? 0.9 * usual_step_s_ + 0.1 * step_s : step_s;
    return;
  }
  writes_seen_ = manager_->writes_done();  // a write has finished: one more measurement
  const double cost = manager_->last_snapshot_seconds() + extra_during_write_;
  extra_during_write_ = 0;
  cost_s_ = cost_s_ > 0 ? 0.5 * cost_s_ + 0.5 * cost : cost;
  const double w = manager_->last_write_seconds();
  write_s_ = write_s_ > 0 ? 0.5 * write_s_ + 0.5 * w : w;
  set_interval(cost_s_, write_s_);
}

// The interval for this cost; logged when it is first set and when it moves by more than a
// quarter.
void RunCheckpoints::set_interval(double stall_s, double write_s) {
  const double s = auto_->seconds(stall_s, write_s);
  manager_->set_every_minutes(s / 60);
  if (logged_s_ > 0 && std::fabs(s - logged_s_) <= 0.25 * logged_s_) return;
  logged_s_ = s;
  log_info(auto_->explain(stall_s, write_s) +
           (write_s > 0 ? "" : " (first estimate: re-measured at the first checkpoint)"));
}

}  // namespace spotrain
