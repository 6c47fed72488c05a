// Trainer (see trainer.h).
#include "run/trainer.h"

#include <algorithm>
#include <cmath>
#include <sys/stat.h>

#include <cstring>
#include <ctime>
#include <deque>
#include <type_traits>
#include <vector>

#include "spot/preemption.h"
#include "engine/checkpoint_state.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "core/test_hooks.h"
#include "observe/progress.h"
#include "run/stop_policy.h"
#include "io/loader.h"
#include "kernels/device_info.h"

namespace spotrain {

namespace {

SessionOptions session_options(const RunConfig& cfg) {
  SessionOptions so;
  so.device = cfg.device;
  so.backend.threads = cfg.threads;
  so.backend.deterministic = cfg.deterministic;
  so.backend.tf32 = cfg.precision == "tf32";  // fp32 storage, TF32 tensor-core math on GPUs
  so.comm_timeout = cfg.comm_timeout;
  return so;
}

TrainingSpec training_spec(const RunConfig& cfg, const io::Dataset& train) {
  TrainingSpec s;
  s.net.arch = cfg.model;
  s.net.num_classes = train.num_classes();
  s.net.in_channels = train.image_shape().c;
  s.net.zero_init_residual = cfg.zero_init_residual;
  s.net.grad_checkpoint = cfg.grad_checkpoint;
  s.seed = cfg.seed;
  s.precision = parse_precision(cfg.precision);
  s.sgd.momentum = cfg.momentum;
  s.sgd.nesterov = cfg.nesterov;
  s.sgd.weight_decay = cfg.weight_decay;
  s.sgd.decay_bn_and_bias = cfg.decay_bn_and_bias;
  s.scaler.static_scale = cfg.loss_scale;
  s.scaler.max_consecutive_overflows = cfg.max_overflow_steps;
  s.reducer.bucket_mb = cfg.bucket_mb;
  s.reducer.compression = cfg.grad_compression;
  s.cuda_graph = cfg.cuda_graph;
  return s;
}

// What rank 0 tells every rank after looking for the checkpoint to resume from.
struct ResumeHeader {
  int64_t status = 0;  // 0: none found, 1: loaded, -1: failed (rank 0 has the error)
  int64_t step = 0, epoch = 0, batch_in_epoch = 0;
  int64_t global_batch = 0, world = 0, sgd_steps = 0;
  int64_t has_ema = 0;  // rank 0 loaded the weights' moving average (--ema-decay)
  LossScalerState scaler;
};
static_assert(std::is_trivially_copyable<ResumeHeader>::value, "broadcast as bytes");

}  // namespace

Trainer::Trainer(const RunConfig& cfg) : cfg_(cfg), created_(now_seconds()) {
  // From the start: a stop signal during set-up or resume stops the run after its first step,
  // with a checkpoint and 75, instead of killing it (143, which no launcher retries).
  install_stop_handlers();
  cfg_.validate();
  session_ = std::make_unique<Session>(session_options(cfg_));
  if (session_->world() > 1) check_ranks_agree();
  int hosts = 1;  // nodes: ranks that are the first on theirs
  if (session_->world() > 1 && cfg_.ckpt_every == "auto") {
    std::vector<uint64_t> local;
    session_->worker().run("count of nodes", [&] { local = session_->comm().allgather(session_->comm().local_rank()); });
    hosts = int(std::count(local.begin(), local.end(), uint64_t(0)));
  }
  data_ = open_data(cfg_.data, cfg_.train_limit, cfg_.test_limit, cfg_.seed, cfg_.image_size);
  SPOTRAIN_CHECK(cfg_.batch_size <= data_.train->size(), "--batch-size ", cfg_.batch_size,
                 " is larger than the training set (", data_.train->size(), " samples)");
  Backend& be = session_->backend();
  if (cfg_.precision == "tf32" && be.device() == Device::cpu)  // said once, at start
    log_info("note: tf32 is a GPU math mode; on the CPU it computes in fp32");
  t_ = session_->make_training(training_spec(cfg_, *data_.train));
  if (cfg_.ema_decay > 0) ema_ = std::make_unique<WeightEma>(*t_.model, cfg_.ema_decay);
  if (cfg_.precision == "fp16" && be.device() == Device::cpu)
    log_info("note: fp16 on the CPU stores fp16 and computes in fp32 (slow; for checking loss "
             "scaling). bf16 is the fast CPU choice.");
  if (!cfg_.ckpt_dir.empty() && session_->rank() == 0) {
    // The run folder, once the data and the model are known good: locked, and refused
    // when it holds another run.
    folder_ = std::make_unique<RunFolder>(cfg_);
    log_file_ = std::fopen(folder_->path("train.log").c_str(), "a");
    SPOTRAIN_CHECK(log_file_, "cannot write ", folder_->path("train.log"));
    log_file() = log_file_;
    log_to_file(str("spotrain train, settings in ", folder_->path("config.toml")));
    CheckpointPolicy policy{cfg_.ckpt_dir, cfg_.keep, cfg_.ckpt_every_steps(), cfg_.ckpt_every_min,
                            cfg_.on_ckpt_error == "continue"};
    const int64_t bytes = checkpoint_bytes(*t_.model, true) + (ema_ ? checkpoint_bytes(*t_.model, false) : 0);
    ckpt_ = std::make_unique<CheckpointManager>(policy, bytes);
    // Snapshot buffers, touched now, so a checkpoint mid-training copies into warm pages
    // (faulting in a fresh ResNet-50-sized buffer costs ~0.5 s on a small machine); pinned
    // on a GPU, so a checkpoint's copy is one DMA that training does not wait for.
    Allocator& staging = be.host_staging_allocator();
    snap_params_ = Tensor({t_.model->num_params()}, DType::f32, staging);
    snap_momentum_ = Tensor({t_.model->num_params()}, DType::f32, staging);
    const double t0 = now_seconds();
    std::memset(snap_params_.raw(), 0, snap_params_.nbytes());
    std::memset(snap_momentum_.raw(), 0, snap_momentum_.nbytes());
    const double touch_seconds = now_seconds() - t0;
    ckpt_->write_class_names(data_.train->class_names());
    if (cfg_.ckpt_every == "auto") {
      // Until a checkpoint has been measured: a stall of about the buffers' first touch.
      auto_interval_ = AutoCheckpointInterval{parse_duration(cfg_.mtbf), hosts};
      set_auto_interval(touch_seconds, 0);
    }
  }
  if (!test_hooks().sample_log.empty()) {  // which samples each step saw
    const std::string& f = test_hooks().sample_log;
    std::string path = session_->world() > 1 ? str(f, ".", session_->rank()) : f;
    sample_log_ = std::fopen(path.c_str(), "a");
    SPOTRAIN_CHECK(sample_log_, "cannot write SPOTRAIN_SAMPLE_LOG file ", path);
  }
  metrics_ = std::make_unique<MetricsSink>(cfg_.metrics_path(), session_->rank() == 0);
  telemetry_ = std::make_unique<Telemetry>(be.device() == Device::cuda ? current_gpu_pci_bus_id() : "");
  if (!cfg_.prometheus.empty() && session_->comm().local_rank() == 0) {
    std::string run = cfg_.ckpt_dir.empty() ? std::string("spotrain") : cfg_.ckpt_dir;
    while (run.size() > 1 && run.back() == '/') run.pop_back();
    run = run.substr(run.find_last_of('/') + 1);
    prom_ = std::make_unique<PrometheusFile>(
        cfg_.prometheus, str("run=\"", prom_escape(run), "\",rank=\"", session_->rank(), "\""));
  }
  if (!cfg_.preempt_notice.empty()) {  // each node asks its own metadata service
    notices_ = std::make_unique<PreemptionWatcher>(cfg_.preempt_notice, cfg_.preempt_poll);
    log_info(str("watching for preemption notices: ", cfg_.preempt_notice, " every ",
                 cfg_.preempt_poll, " s"));
  }
  if (metrics_->enabled()) {
    // Where and how the run ran: backend, ranks, GPU and CUDA library versions, settings.
    nlohmann::json j{{"backend", be.name()}, {"ranks", session_->world()},
                     {"comm", session_->comm().name()}, {"precision", cfg_.precision},
                     {"config", nlohmann::json::parse(cfg_.to_json())}};
    for (auto& [k, v] : gpu_info_fields(gpu_info())) j["machine"][k] = v;
    metrics_->write("start", j);
  }
}

Trainer::~Trainer() {
  if (sample_log_) std::fclose(sample_log_);
  if (log_file_) {
    log_file() = nullptr;
    std::fclose(log_file_);
  }
}

// Every rank must train the same thing: each setting not marked per-node in config.h is
// hashed and compared across ranks; a difference names the rank and the setting.
void Trainer::check_ranks_agree() {
  for_each_setting(cfg_, [&](const SettingInfo& s, const auto& value) {
    if (s.flags & kPerNode) return;
    nlohmann::json v = value;
    uint64_t h = uint64_t(std::hash<std::string>{}(v.dump()));
    std::vector<uint64_t> all;
    session_->worker().run(str("start-up check of ", s.name),
                           [&] { all = session_->comm().allgather(h); });
    std::string flag = s.flag;
    flag = flag.substr(0, flag.find(','));  // "--augment,!--no-augment" -> "--augment"
    for (size_t r = 1; r < all.size(); ++r)
      SPOTRAIN_CHECK(all[r] == all[0], "rank ", r, " was started with a different ", flag,
                     " than rank 0; every rank must get the same settings");
  });
}

std::string Trainer::write_checkpoint(const Position& at, bool sync) {
  std::string path;
  // The last step's verdict read back first: the optimizer and loss-scaler state saved then
  // match the weights (a step that went wrong throws here, before anything is written).
  t_.runner->settle();
  if (ckpt_) {
    auto snapshot = [&] {
      CheckpointInfo info;
      info.config_json = cfg_.to_json();
      info.model = cfg_.model;
      info.epoch = at.epoch;
      info.batch_in_epoch = at.batch_in_epoch;
      info.global_step = at.step;
      info.global_batch = cfg_.batch_size * session_->world();
      info.world_size = session_->world();
      info.samples_in_epoch = at.batch_in_epoch * info.global_batch;
      info.seed = cfg_.seed;
      info.num_classes = data_.train->num_classes();
      info.in_channels = data_.train->image_shape().c;
      info.precision = cfg_.precision;
      info.scaler = t_.scaler->state();
      // Rank 0's BN statistics are saved (as every rank loads them on resume).
      CheckpointSnapshot s = snapshot_checkpoint(*t_.model, t_.sgd.get(), info, &snap_params_, &snap_momentum_);
      if (ema_) s.ema = ema_snapshot(*t_.model, *ema_);
      return s;
    };
    path = ckpt_->write(at.step, snapshot, sync);
    if (!path.empty()) {
      ckpt_started_ = path;
      if (sync) ckpt_done_ = path;
      metrics_->write("checkpoint", {{"step", at.step}, {"path", path}, {"background", !sync}});
    }
  }
  if (sync && session_->world() > 1)  // nobody exits before rank 0's file is safe
    session_->worker().run("barrier after the checkpoint", [&] { session_->comm().barrier(); });
  return path;
}

Trainer::Position Trainer::resume() {
  Position at;
  if (cfg_.resume == "none") return at;
  ResumeHeader h;
  std::string path, error;
  Model& model = *t_.model;
  if (session_->rank() == 0) {
    try {
      path = cfg_.resume == "auto" ? newest_good_checkpoint(cfg_.ckpt_dir) : cfg_.resume;
      if (!path.empty()) {
        CheckpointInfo ci = load_training_state(path, model, *t_.sgd);
        SPOTRAIN_CHECK(ci.model == cfg_.model, "checkpoint ", path, " is a ", ci.model,
                       " checkpoint; this run trains ", cfg_.model);
        h.status = 1;
        h.step = ci.global_step;
        h.epoch = ci.epoch;
        h.batch_in_epoch = ci.batch_in_epoch;
        h.world = ci.world_size > 0 ? ci.world_size : 1;
        h.global_batch = ci.global_batch > 0 ? ci.global_batch : cfg_.batch_size * h.world;
        h.sgd_steps = t_.sgd->steps();
        h.scaler = ci.scaler;
        if (ema_ && checkpoint_has_group(path, "ema")) {
          ema_ = std::make_unique<WeightEma>(model, cfg_.ema_decay);
          load_ema(path, model, *ema_);
          h.has_ema = 1;
        }
      }
    } catch (const std::exception& e) {
      h.status = -1;
      error = e.what();
    }
  }
  if (session_->world() > 1)
    session_->worker().run("broadcast of the resume point",
                           [&] { session_->comm().broadcast(&h, sizeof h, 0); });
  if (h.status < 0) {
    if (session_->rank() == 0) throw Error(error);
    SPOTRAIN_THROW("rank 0 could not load the checkpoint to resume from (its error says why)");
  }
  if (h.status == 0) {
    log_info(str("--resume ", cfg_.resume, ": no checkpoint in ", cfg_.ckpt_dir,
                 "; starting from scratch"));
    return at;
  }
  const int64_t world = session_->world();
  SPOTRAIN_CHECK(h.global_batch % world == 0, "the checkpoint was trained with a global batch of ",
                 h.global_batch, " on ", h.world, " rank(s); it does not divide over ", world,
                 " ranks. Resume on a rank count that divides ", h.global_batch);
  if (h.global_batch / world != cfg_.batch_size) {
    log_info(str("resuming a ", h.world, "-rank checkpoint on ", world, " rank(s): per-rank batch ",
                 h.global_batch / world, " keeps its global batch of ", h.global_batch,
                 " (--batch-size ", cfg_.batch_size, " is overridden)"));
    cfg_.batch_size = h.global_batch / world;
  }
  if (world > 1) {  // every rank continues from rank 0's state
    session_->broadcast_from_rank0(model.flat_params(), "the checkpoint's parameters");
    session_->broadcast_from_rank0(t_.sgd->momentum(), "the checkpoint's momentum");
    session_->broadcast_buffers(model);
    t_.sgd->set_steps(h.sgd_steps);
  }
  if (ema_ && !h.has_ema) {  // a checkpoint from a run without the average: it starts here
    ema_ = std::make_unique<WeightEma>(model, cfg_.ema_decay);
    log_info("the checkpoint holds no moving average of the weights: --ema-decay starts from its weights");
  } else if (ema_ && world > 1) {
    session_->broadcast_from_rank0(ema_->params(), "the checkpoint's moving average");
    for (Tensor& b : ema_->buffers()) session_->broadcast_from_rank0(b, "the moving average's statistics");
  }
  t_.scaler->set_state(h.scaler);
  at.step = h.step;
  at.epoch = h.epoch;
  at.batch_in_epoch = h.batch_in_epoch;
  log_info(str("resumed from ", session_->rank() == 0 ? path : std::string("rank 0's checkpoint"),
               ": step ", at.step, ", epoch ", at.epoch + 1, ", batch ", at.batch_in_epoch));
  // How the previous process ended, from the metrics it left: its stop or end record, else
  // nothing (it was killed, or crashed, after its last record).
  const nlohmann::json& prev = metrics_->previous_last();
  std::string after = "unknown (no metrics of the previous process)";
  if (prev.is_object() && prev.value("type", "") == "stop")
    after = "stopped by " + prev.value("reason", std::string("?"));
  else if (prev.is_object() && prev.value("type", "") == "end")
    after = "finished";
  else if (prev.is_object())
    after = str("ended without a stop record after step ", prev.value("step", int64_t(0)),
                " (killed or crashed)");
  ckpt_done_ = path;
  metrics_->write("resume", {{"step", at.step}, {"epoch", at.epoch + 1},
                             {"batch_in_epoch", at.batch_in_epoch}, {"checkpoint", path},
                             {"previous", after}, {"ranks", session_->world()}});
  return at;
}

EvalResult Trainer::evaluate(const io::Dataset& data, int64_t batch_size) {
  session_->broadcast_buffers(*t_.model);  // rank 0's BN statistics, as DDP: one model
  return evaluate_model(*t_.model, data, data_.kind, batch_size, t_.runner->compute_dtype(),
                        &session_->worker(), cfg_.workers, cfg_.max_bad_fraction);
}

io::LoaderOptions Trainer::loader_options() const {
  io::LoaderOptions lo;
  lo.batch_size = cfg_.batch_size;
  lo.train = true;
  lo.seed = cfg_.seed;
  lo.workers = cfg_.workers;
  lo.prefetch = cfg_.prefetch;
  lo.image_allocator = &session_->backend().host_staging_allocator();  // pinned on CUDA
  lo.augment = cfg_.augment;
  lo.erasing.p = cfg_.random_erasing;
  lo.mix.mixup_alpha = cfg_.mixup;
  lo.mix.cutmix_alpha = cfg_.cutmix;
  lo.mix.switch_prob = cfg_.mix_switch_prob;
  lo.max_bad_fraction = cfg_.max_bad_fraction;
  if (data_.train->encoded()) lo.image = image_transforms_for(*data_.train);
  lo.rank = session_->rank();
  lo.world = session_->world();
  lo.transforms = transforms_for(data_.kind, *data_.train, true, cfg_.augment);
  return lo;
}

Trainer::Plan Trainer::plan(int64_t per_epoch) const {
  Plan p;
  p.per_epoch = per_epoch;
  p.total_steps = cfg_.steps > 0 ? cfg_.steps : cfg_.epochs * per_epoch;
  p.epochs = (p.total_steps + per_epoch - 1) / per_epoch;
  p.lr.kind = cfg_.lr_schedule;
  p.lr.base_lr = cfg_.lr_per_256 > 0
                     ? cfg_.lr_per_256 * float(cfg_.batch_size * session_->world()) / 256.f
                     : cfg_.lr;
  p.lr.total_steps = p.total_steps;
  p.lr.warmup_steps = int64_t(std::llround(cfg_.warmup_epochs * double(per_epoch)));
  p.lr.milestones = {p.total_steps / 2, p.total_steps * 3 / 4};
  p.lr.validate();
  return p;
}

void Trainer::log_start(const Plan& p) {
  log_info(str("model ", cfg_.model, ": ", t_.model->summary()));
  if (session_->world() > 1)
    log_info(str("data parallel over ", session_->world(), " ranks (", session_->comm().name(),
                 "), global batch ", cfg_.batch_size * session_->world(), ", ",
                 t_.sync->num_buckets(), " gradient buckets of up to ", cfg_.bucket_mb,
                 " MB, compression ", cfg_.grad_compression));
  if (session_->backend().device() == Device::cuda) log_info(gpu_info_line(gpu_info()));
  if (cfg_.lr_per_256 > 0)
    log_info(str("learning rate ", fmt_fixed(p.lr.base_lr, 5), " = --lr-per-256 ", cfg_.lr_per_256,
                 " x global batch ", cfg_.batch_size * session_->world(), " / 256"));
  if (ema_) log_info(str("keeping a moving average of the weights (--ema-decay ", cfg_.ema_decay, ")"));
  log_info(str("backend ", session_->backend().name(), "; data ", data_.kind, ": ",
               data_.train->size(), " train / ", data_.test->size(), " test samples; ", p.epochs,
               " epoch(s) of ", p.per_epoch, " steps, batch ", cfg_.batch_size));
}

// Test hooks at the start of a step (core/test_hooks.h): SPOTRAIN_FAULT, and the
// sample ids of the step's batch for SPOTRAIN_SAMPLE_LOG.
void Trainer::step_hooks(int64_t step, const io::Batch& b) {
  inject_fault(session_->rank(), step);
  if (!sample_log_) return;
  std::fprintf(sample_log_, "%lld", static_cast<long long>(step));
  for (int64_t id : b.sample_ids) std::fprintf(sample_log_, " %lld", static_cast<long long>(id));
  std::fprintf(sample_log_, "\n");
  std::fflush(sample_log_);
}

// What writing a checkpoint costs (snapshot + write + verify), once one has been written.
// --ckpt-every auto: what a background checkpoint costs training is the stall for the state
// copy plus what the write takes from the steps it runs beside (on a CPU, cores; on a GPU,
// little): the steps during a write are compared with the usual step time. The interval
// follows the cost, smoothed over checkpoints.
void Trainer::measure_checkpoint_cost(double step_s) {
  if (ckpt_->writing()) {
    if (usual_step_s_ > 0) extra_during_write_ += std::max(0.0, step_s - usual_step_s_);
    return;
  }
  if (ckpt_->writes_done() == writes_seen_) {  // an ordinary step
    usual_step_s_ = usual_step_s_ > 0 ? 0.9 * usual_step_s_ + 0.1 * step_s : step_s;
    return;
  }
  writes_seen_ = ckpt_->writes_done();  // a write has finished: one more measurement
  const double cost = ckpt_->last_snapshot_seconds() + extra_during_write_;
  extra_during_write_ = 0;
  cost_s_ = cost_s_ > 0 ? 0.5 * cost_s_ + 0.5 * cost : cost;
  write_s_ = write_s_ > 0 ? 0.5 * write_s_ + 0.5 * ckpt_->last_write_seconds() : ckpt_->last_write_seconds();
  set_auto_interval(cost_s_, write_s_);
}

// The interval for this cost; logged when it is first set and when it moves by more than a
// quarter.
void Trainer::set_auto_interval(double stall_s, double write_s) {
  const double s = auto_interval_->seconds(stall_s, write_s);
  ckpt_->set_every_minutes(s / 60);
  if (auto_logged_s_ > 0 && std::fabs(s - auto_logged_s_) <= 0.25 * auto_logged_s_) return;
  auto_logged_s_ = s;
  log_info(auto_interval_->explain(stall_s, write_s) +
           (write_s > 0 ? "" : " (first estimate: re-measured at the first checkpoint)"));
}

double Trainer::checkpoint_seconds() const {
  if (!ckpt_ || ckpt_->last_write_seconds() <= 0) return 0.0;
  return ckpt_->last_snapshot_seconds() + ckpt_->last_write_seconds();
}

// After an epoch: its figures over all ranks, then evaluation when due (and always after the
// last epoch), logged and recorded.
void Trainer::end_epoch(int64_t epoch, bool last_epoch, Progress& progress, const Plan& p,
                        int64_t step, TrainResult& res) {
  double secs = 0;
  const Tally ep = progress.end_epoch(&secs);
  res.final_loss = ep.mean_loss();
  res.train_top1 = ep.accuracy();
  res.images_per_sec = double(ep.n) / std::max(1e-9, secs);
  const bool eval_due =
      cfg_.eval_each_epoch && cfg_.eval_every > 0 && (epoch + 1) % cfg_.eval_every == 0;
  if (!eval_due && !last_epoch) return;
  res.test = evaluate(*data_.test, std::max<int64_t>(cfg_.batch_size, 256));
  if (ema_) {
    EmaSwap with_average(ema_.get());
    res.ema_test = evaluate(*data_.test, std::max<int64_t>(cfg_.batch_size, 256));
  }
  log_info(str("epoch ", epoch + 1, " done in ", fmt_duration(secs), ": train loss ",
               fmt_fixed(res.final_loss, 4), " train acc ", fmt_fixed(100 * res.train_top1, 2),
               "% | test loss ", fmt_fixed(res.test.loss, 4), " top-1 ",
               fmt_fixed(100 * res.test.top1, 2), "% top-5 ", fmt_fixed(100 * res.test.top5, 2),
               "% (", res.test.samples, " images)",
               ema_ ? str(" | EMA top-1 ", fmt_fixed(100 * res.ema_test.top1, 2), "% top-5 ",
                          fmt_fixed(100 * res.ema_test.top5, 2), "%")
                    : std::string()));
  nlohmann::json rec{{"epoch", epoch + 1}, {"step", step}, {"loss", res.final_loss},
                     {"train_top1", res.train_top1}, {"test_loss", res.test.loss},
                     {"test_top1", res.test.top1}, {"test_top5", res.test.top5},
                     {"lr", p.lr.at(step - 1)}, {"images_per_sec", res.images_per_sec},
                     {"epoch_seconds", secs}};
  if (ema_) {
    rec["ema_test_loss"] = res.ema_test.loss;
    rec["ema_test_top1"] = res.ema_test.top1;
    rec["ema_test_top5"] = res.ema_test.top5;
  }
  metrics_->write("epoch", rec);
}

TrainResult Trainer::run() {
  Position at = resume();  // may change the per-rank batch (elastic resume)
  io::Loader loader(data_.train, loader_options());
  const Plan p = plan(loader.batches_per_epoch());
  log_start(p);
  if (at.batch_in_epoch >= p.per_epoch) at = Position{at.step, at.epoch + 1, 0};
  StopPolicy stop(cfg_.max_wall_time, created_, t_.sync.get());
  Progress progress(session_->worker(), *metrics_, *t_.scaler, session_->backend().allocator(),
                    *telemetry_, cfg_.log_every, cfg_.workers, p.epochs, p.total_steps, at.step);
  TrainResult res;
  const double t_start = now_seconds();
  const int64_t first_epoch = at.epoch;
  // Steps queued whose loss the host has not read yet (StepRunner reads a step's figures
  // during the next one). They reach the progress line in order, at the same point on every
  // rank (its figures are summed over ranks): after each step, and after settle() where all
  // ranks settle (an epoch's end, the last step, a stop).
  struct Unread {
    StepFacts facts;
    StepTimes phases;
    bool timed = false;
  };
  std::deque<Unread> unread;
  auto account = [&] {
    for (const StepResult& r : t_.runner->take_results()) {
      SPOTRAIN_CHECK(!unread.empty(), "internal: a step's figures without its step");
      Unread u = std::move(unread.front());
      unread.pop_front();
      u.facts.loss = r.loss;
      u.facts.done_at = r.done_at;
      u.facts.phases = u.timed ? &u.phases : nullptr;
      if (const nlohmann::json* rec = progress.step(u.facts)) publish(*rec, true);
    }
  };
  auto settle_all = [&] {
    t_.runner->settle();
    account();
  };
  for (int64_t epoch = first_epoch; epoch < p.epochs && at.step < p.total_steps; ++epoch) {
    loader.start_epoch(epoch, epoch == first_epoch ? at.batch_in_epoch : 0);
    progress.start_epoch();
    io::Batch b;
    for (;;) {
      if (at.step >= p.total_steps) break;
      const double wait_t0 = now_seconds();  // the time this step waits for its batch
      if (!loader.next(b)) break;
      Unread u;
      u.facts.data_wait = now_seconds() - wait_t0;
      const float lr = p.lr.at(at.step);
      session_->worker().set_step(at.step + 1);  // 1-based, as in the progress lines
      step_hooks(at.step + 1, b);
      stop.before_step();
      u.timed = progress.due_for_phases(at.step + 1);
      const LabelMix mix{b.labels_b.data(), b.lam.data()};
      t_.runner->queue(b.images, b.labels.data(), lr, cfg_.label_smoothing,
                       u.timed ? &u.phases : nullptr, b.lam.empty() ? nullptr : &mix);
      if (ema_) ema_->update();
      at = Position{at.step + 1, epoch, b.batch_index + 1};
      const bool epoch_end = at.batch_in_epoch == p.per_epoch;
      u.facts.step = at.step;
      u.facts.epoch = epoch;
      u.facts.lr = lr;
      u.facts.batch = int64_t(b.labels.size());
      u.facts.epoch_end = epoch_end;
      unread.push_back(std::move(u));
      if (epoch_end || at.step >= p.total_steps) t_.runner->settle();
      account();
      const std::string why = stop.after_step(progress.last_step_seconds(), checkpoint_seconds());
      if (!why.empty() && at.step < p.total_steps) {  // checkpoint, then exit 75
        SPOTRAIN_CHECK(!cfg_.ckpt_dir.empty(), "stopped by ", why, " at step ", at.step,
                       " with no --ckpt-dir: nothing was saved");
        settle_all();
        res.checkpoint = write_checkpoint(at, /*sync=*/true);
        log_info(str("stopped by ", why, " after step ", at.step, "; resume with --resume auto"));
        metrics_->write("stop", {{"step", at.step}, {"reason", why}, {"checkpoint", res.checkpoint}});
        publish(last_record_, false);
        res.stopped = true;
        res.steps = at.step;
        res.seconds = now_seconds() - t_start;
        return res;
      }
      // Periodic and epoch-end checkpoints: rank 0 alone decides and writes in the background
      // (write_checkpoint settles the step; its figures reach the progress line with the next).
      if (ckpt_) ckpt_->poll();
      if (auto_interval_) measure_checkpoint_cost(progress.last_step_seconds());
      if (ckpt_ && at.step < p.total_steps && ckpt_->due(at.step, epoch_end))
        res.checkpoint = write_checkpoint(at, /*sync=*/false);
    }
    settle_all();
    end_epoch(epoch, !(epoch + 1 < p.epochs && at.step < p.total_steps), progress, p, at.step, res);
  }
  report_bad_images(loader, res);
  res.steps = at.step;
  res.seconds = now_seconds() - t_start;
  res.skipped_steps = t_.scaler->state().skipped_steps;
  res.loss_scale = t_.scaler->scale();
  if (!cfg_.ckpt_dir.empty()) res.checkpoint = write_checkpoint(at, /*sync=*/true);
  metrics_->write("end", {{"step", at.step}, {"checkpoint", res.checkpoint},
                          {"test_top1", res.test.top1}, {"seconds", res.seconds}});
  publish(last_record_, false);
  return res;
}

void Trainer::publish(const nlohmann::json& record, bool running) {
  if (running) last_record_ = record;
  if (!prom_ || !record.is_object()) return;
  std::vector<PromSample> s = prom_samples_of_record(record);
  s.push_back({"spotrain_running", "1 while the run trains, 0 once it has stopped or ended", "gauge",
               "", running ? 1.0 : 0.0});
  s.push_back({"spotrain_last_update_timestamp_seconds",
               "when this file was written (a stale file: the run is gone)", "gauge", "",
               double(std::time(nullptr))});
  if (session_->rank() == 0) {
    s.push_back({"spotrain_restarts", "processes this run was restarted in (resumes)", "gauge", "",
                 double(std::max<int64_t>(0, metrics_->previous_starts()))});
    struct stat st {};
    if (!ckpt_started_.empty() && ::stat(ckpt_started_.c_str(), &st) == 0) ckpt_done_ = ckpt_started_;
    if (!ckpt_done_.empty() && ::stat(ckpt_done_.c_str(), &st) == 0)
      s.push_back({"spotrain_last_checkpoint_age_seconds", "seconds since the newest checkpoint was written",
                   "gauge", "", double(std::time(nullptr) - st.st_mtime)});
  }
  try {
    prom_->write(s);
  } catch (const std::exception& e) {  // a monitoring file never stops training
    std::fprintf(stderr, "warning: %s; --prometheus is off for the rest of this run\n", e.what());
    prom_.reset();
  }
}

void Trainer::report_bad_images(io::Loader& loader, TrainResult& res) {
  auto bad = loader.bad_samples();
  res.bad_images = int64_t(bad.size());
  if (bad.empty()) return;
  std::string list;
  for (size_t i = 0; i < bad.size() && i < 20; ++i) list += "\n  " + bad[i].what;
  std::fprintf(stderr, "warning: rank %d skipped %zu unreadable training image(s):%s%s\n",
               session_->rank(), bad.size(), list.c_str(), bad.size() > 20 ? "\n  ..." : "");
}

}  // namespace spotrain
