// RunCheckpoints (see run_checkpoints.h).
#include "run/run_checkpoints.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"

namespace spotrain {

RunCheckpoints::RunCheckpoints(const RunConfig& cfg, const BatchSplit& split, Session& session, Training& t,
                               WeightEma* ema, const io::Dataset& train, const RunStorage& storage)
    : cfg_(cfg),
      split_(split),
      session_(session),
      t_(t),
      ema_(ema),
      num_classes_(train.num_classes()),
      in_channels_(train.image_shape().c),
      storage_(storage),
      copies_(storage.writers.size() > 1 && t.sync != nullptr) {
  int hosts = 1;  // nodes: ranks that are the first on theirs
  if (session.world() > 1 && cfg.ckpt_every == "auto") {
    std::vector<uint64_t> local;
    session.worker().run("count of nodes", [&] { local = session.comm().allgather(session.comm().local_rank()); });
    hosts = int(std::count(local.begin(), local.end(), uint64_t(0)));
  }
  if (!cfg.ckpt_dir.empty() && session.world() > 1 && cfg.lost_peer_save > 0) {
    survive_ = true;
    bn_done_ = Tensor(t.model->flat_buffers().shape(), DType::f32, session.backend().allocator());
    session.worker().on_lost_peer([this] { return save_on_lost_peer(); });
  }
  if (copies_) bn_rank0_ = Tensor(t.model->flat_buffers().shape(), DType::f32, session.backend().allocator());
  if (cfg.ckpt_dir.empty() || !storage.writer) return;
  CheckpointPolicy policy{cfg.ckpt_dir, cfg.keep, cfg.ckpt_every_steps(), cfg.ckpt_every_min,
                          cfg.on_ckpt_error == "continue",
                          session.rank() == 0 ? std::string() : str("r", session.rank())};
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
  if (cfg.ckpt_every == "auto" && session.rank() == 0) {  // rank 0 decides when one is due
    // Until a checkpoint has been measured: a stall of about the buffers' first touch.
    auto_ = AutoCheckpointInterval{parse_duration(cfg.mtbf), hosts};
    set_interval(touch_seconds, 0);
  }
}

void RunCheckpoints::report_to(MetricsSink* metrics, PrometheusExport* prometheus) {
  metrics_ = metrics;
  prometheus_ = prometheus;
}

void RunCheckpoints::after_resume(const TrainPosition& at, bool from_named_file) {
  if (!manager_) return;
  if (from_named_file) {
    std::string stamp = utc_time_iso();
    std::replace(stamp.begin(), stamp.end(), ':', '-');
    const std::string to = "abandoned-" + stamp;
    const int moved = move_checkpoints_after(cfg_.ckpt_dir, at.step, to);
    if (moved > 0)
      log_info(str("resumed from step ", at.step, ": the ", moved, " checkpoint(s) after it in ",
                   cfg_.ckpt_dir, " moved to ", cfg_.ckpt_dir, "/", to, "/"));
  }
  if (!copies_) return;
  const std::string mine = checkpoint_path(cfg_.ckpt_dir, at.step);
  try {
    verify_checkpoint(mine, nullptr);
    return;  // this disk holds it
  } catch (const std::exception&) {
  }
  // Every rank holds the resumed state (its BN statistics included): a snapshot of our own.
  const std::string path = manager_->write(at.step, [&] { return snapshot(at); }, /*sync=*/false);
  if (!path.empty())
    log_info(str("this rank's folder lacked the checkpoint resumed from: writing its copy ", path));
}

CheckpointSnapshot RunCheckpoints::snapshot(const TrainPosition& at, bool warm, const Tensor* bn_stats) {
  RunIdentity run;
  run.config_json = cfg_.to_json();
  run.model = cfg_.model;
  run.precision = cfg_.precision;
  run.seed = cfg_.seed;
  run.num_classes = num_classes_;
  run.in_channels = in_channels_;
  run.world = session_.world();
  run.global_batch = split_.global();
  const CheckpointInfo info = checkpoint_record(run, at, t_.scaler->state());
  // Rank 0's BN statistics are saved (as every rank loads them on resume): a copy's writer
  // saves the ones rank 0 sent it (bn_rank0_).
  const bool w = warm && snap_params_.defined();
  CheckpointSnapshot s = snapshot_checkpoint(*t_.model, t_.sgd.get(), info, w ? &snap_params_ : nullptr,
                                             w ? &snap_momentum_ : nullptr, bn_stats);
  if (ema_) s.ema = ema_snapshot(*t_.model, *ema_);
  return s;
}

std::string RunCheckpoints::write(const TrainPosition& at, bool sync) {
  t_.runner->settle();  // a step that went wrong throws here, before anything is written
  if (copies_) {  // every rank: rank 0's BN statistics to every writer of a copy
    Backend& be = session_.backend();
    if (session_.rank() == 0) be.copy(t_.model->flat_buffers(), bn_rank0_);
    session_.broadcast_from_rank0(bn_rank0_, "the BN statistics of the checkpoint");
  }
  std::string path;
  if (manager_) {
    path = manager_->write(at.step, [&] { return snapshot(at, true, copies_ ? &bn_rank0_ : nullptr); }, sync);
    if (!path.empty()) {
      if (prometheus_) prometheus_->checkpoint(path, sync);
      // What it held training, and the last completed write (0 before the first): what
      // `spotrain plan --from-run` prices a checkpoint at.
      if (metrics_)
        metrics_->write("checkpoint", {{"step", at.step}, {"path", path}, {"background", !sync},
                                       {"held_seconds", manager_->last_snapshot_seconds()},
                                       {"write_seconds", manager_->last_write_seconds()}});
    }
  }
  if (sync && session_.world() > 1)  // nobody exits before every copy is safe
    session_.worker().run("barrier after the checkpoint", [&] { session_.comm().barrier(); });
  return path;
}

void RunCheckpoints::before_step(const TrainPosition& next, bool epoch_end, int64_t total_steps) {
  // Several writers must write the same step: rank 0 decides before the step and its word
  // travels with the step's gradients (the control slot), so every rank knows after it.
  if (!copies_ || session_.rank() != 0 || !manager_) return;
  const bool due = next.step < total_steps && manager_->due(next.step, epoch_end);
  t_.sync->set_control(kCheckpointSlot, due ? 1.f : 0.f);
}

std::string RunCheckpoints::after_step(const TrainPosition& at, bool epoch_end, double step_seconds,
                                       double steady_step_seconds, int64_t total_steps) {
  if (manager_) manager_->poll();
  if (auto_) measure_cost(step_seconds, steady_step_seconds);
  // One writer: rank 0 alone decides and writes in the background (write settles the step;
  // its figures reach the progress line with the next). Copies: as rank 0 said.
  const bool due = copies_ ? t_.sync->control(kCheckpointSlot) > 0
                           : manager_ && at.step < total_steps && manager_->due(at.step, epoch_end);
  return due ? write(at, /*sync=*/false) : "";
}

double RunCheckpoints::seconds() const {
  if (!manager_ || manager_->last_write_seconds() <= 0) return 0.0;
  return manager_->last_snapshot_seconds() + manager_->last_write_seconds();
}

void RunCheckpoints::step_done(const TrainPosition& at) {
  if (!survive_) return;
  session_.backend().copy(t_.model->flat_buffers(), bn_done_);  // queued: the next forward comes after
  done_ = at;
  have_done_ = true;
}

std::string RunCheckpoints::save_on_lost_peer() {
  namespace fs = std::filesystem;
  if (!have_done_) return "no step was finished by every rank: nothing to save";
  const double t0 = now_seconds();
  const TrainPosition at = done_;
  try {
    t_.runner->settle();  // the optimizer and loss-scaler state of that step
    // Lost during the moving average's evaluation: the model's own weights back first (the
    // evaluation's EmaSwap never gets to it: the job ends from here).
    if (ema_ && ema_->swapped()) ema_->swap();
  } catch (const std::exception& e) {
    return str("step ", at.step, " cannot be saved: ", e.what());
  }
  const std::string& dir = cfg_.ckpt_dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string path = checkpoint_path(dir, at.step);
  try {
    verify_checkpoint(path, nullptr);
    return str("step ", at.step, " is saved already (", path, ")");
  } catch (const std::exception&) {  // not there, or not whole: save it
  }
  // One survivor per folder and step: the first to create the claim writes (a shared folder
  // holds one copy, each node-local disk its own).
  const std::string claim = str(dir, "/.survivor-", at.step);
  const int fd = ::open(claim.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0)
    return errno == EEXIST ? str("another survivor saves step ", at.step, " to ", dir)
                           : str("cannot claim the save of step ", at.step, " in ", dir, ": ",
                                 std::strerror(errno));
  ::close(fd);
  // Fresh host buffers (the warm ones may feed a background write still running), this
  // rank's BN statistics of that step, a temporary name of this rank's own.
  auto snap = std::make_shared<CheckpointSnapshot>(snapshot(at, /*warm=*/false, &bn_done_));
  auto done = std::make_shared<std::atomic<int>>(0);  // 1 saved, -1 failed
  auto error = std::make_shared<std::string>();
  const std::string tmp = str(path, ".survivor-", session_.rank(), ".tmp");
  const int keep = cfg_.keep;
  std::thread([snap, done, error, path, tmp, keep, claim] {
    try {
      write_checkpoint_file(path, *snap, tmp);
      finish_checkpoint(path, keep);
      std::remove(claim.c_str());
      done->store(1);
    } catch (const std::exception& e) {
      *error = e.what();
      done->store(-1);
    }
  }).detach();  // past the deadline the job ends with it: only the temporary is left
  while (done->load() == 0 && now_seconds() - t0 < cfg_.lost_peer_save)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const double took = now_seconds() - t0;
  std::string said;
  if (done->load() == 1)
    said = str("saved the last step every rank finished, step ", at.step, ", to ", path, " in ",
               fmt_fixed(took, 2), " s (verified)");
  else if (done->load() == -1)
    said = str("could not save step ", at.step, ": ", *error);
  else
    said = str("could not save step ", at.step, " within --lost-peer-save ", cfg_.lost_peer_save,
               " s; the checkpoints before it are untouched");
  // The metrics say so too (this rank's sink, or the file itself where this rank has none: one
  // survivor per folder gets here).
  try {
    nlohmann::json record{{"step", at.step}, {"rank", session_.rank()}, {"saved", done->load() == 1},
                          {"checkpoint", done->load() == 1 ? path : std::string()},
                          {"save_seconds", took}, {"message", said}};
    if (metrics_ && metrics_->enabled())
      metrics_->write("lost_peer", std::move(record));
    else if (!cfg_.metrics_path().empty())
      MetricsSink::append(cfg_.metrics_path(), "lost_peer", std::move(record));
  } catch (const std::exception&) {  // the record is a report: the save stands without it
  }
  return said;
}

// --ckpt-every auto: what a background checkpoint costs training is the stall for the state
// copy plus what the write takes from the steps it runs beside (on a CPU, cores; on a GPU,
// little): the steps during a write are compared with the steady-state step time (not with
// a warm-up's). The interval follows the cost, smoothed over checkpoints.
void RunCheckpoints::measure_cost(double step_s, double steady_s) {
  if (manager_->writing()) {
    if (steady_s > 0) extra_during_write_ += std::max(0.0, step_s - steady_s);
    return;
  }
  if (manager_->writes_done() == writes_seen_) return;  // an ordinary step
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
