// Trainer (see trainer.h).
#include "engine/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "checkpoints/preemption.h"
#include "engine/checkpoint_state.h"
#include "engine/core/clock.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/core/test_hooks.h"
#include "engine/lr_schedule.h"
#include "engine/stop_policy.h"
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
  return s;
}

// Loss and accuracy summed over the steps of a progress window or an epoch.
struct Tally {
  double loss = 0;  // sum of per-sample losses
  int64_t correct = 0, n = 0;
  void add(const LossResult& l, int64_t batch) {
    loss += l.loss * double(batch);
    correct += l.top1;
    n += batch;
  }
  // The whole job's figures (sums over ranks).
  void sum_over(CommWorker& w, const std::string& what) {
    double v[3] = {loss, double(correct), double(n)};
    sum_across_ranks(w, v, 3, what);
    loss = v[0];
    correct = int64_t(v[1]);
    n = int64_t(v[2]);
  }
  double mean_loss() const { return n ? loss / double(n) : 0; }
  double accuracy() const { return n ? double(correct) / double(n) : 0; }
};

// What rank 0 tells every rank after looking for the checkpoint to resume from.
struct ResumeHeader {
  int64_t status = 0;  // 0: none found, 1: loaded, -1: failed (rank 0 has the error)
  int64_t step = 0, epoch = 0, batch_in_epoch = 0;
  int64_t global_batch = 0, world = 0, sgd_steps = 0;
  LossScalerState scaler;
};
static_assert(std::is_trivially_copyable<ResumeHeader>::value, "broadcast as bytes");

}  // namespace

Trainer::Trainer(const RunConfig& cfg) : cfg_(cfg), created_(now_seconds()) {
  cfg_.validate();
  session_ = std::make_unique<Session>(session_options(cfg_));
  if (session_->world() > 1) check_ranks_agree();
  data_ = open_data(cfg_.data, cfg_.train_limit, cfg_.test_limit, cfg_.seed, cfg_.image_size);
  SPOTRAIN_CHECK(cfg_.batch_size <= data_.train->size(), "--batch-size ", cfg_.batch_size,
                 " is larger than the training set (", data_.train->size(), " samples)");
  Backend& be = session_->backend();
  if (cfg_.precision == "tf32" && be.device() == Device::cpu)  // said once, at start
    log_info("note: tf32 is a GPU math mode; on the CPU it computes in fp32");
  t_ = session_->make_training(training_spec(cfg_, *data_.train));
  if (cfg_.precision == "fp16" && be.device() == Device::cpu)
    log_info("note: fp16 on the CPU stores fp16 and computes in fp32 (slow; for checking loss "
             "scaling). bf16 is the fast CPU choice.");
  if (!cfg_.ckpt_dir.empty() && session_->rank() == 0) {
    CheckpointPolicy policy{cfg_.ckpt_dir, cfg_.keep, cfg_.ckpt_every, cfg_.ckpt_every_min};
    ckpt_ = std::make_unique<CheckpointManager>(policy, checkpoint_bytes(*t_.model, true));
    // Snapshot buffers, touched now, so a checkpoint mid-training copies into warm pages
    // (faulting in a fresh ResNet-50-sized buffer costs ~0.5 s on a small machine); pinned
    // on a GPU, so a checkpoint's copy is one DMA that training does not wait for.
    Allocator& staging = be.host_staging_allocator();
    snap_params_ = Tensor({t_.model->num_params()}, DType::f32, staging);
    snap_momentum_ = Tensor({t_.model->num_params()}, DType::f32, staging);
    std::memset(snap_params_.raw(), 0, snap_params_.nbytes());
    std::memset(snap_momentum_.raw(), 0, snap_momentum_.nbytes());
    ckpt_->write_class_names(data_.train->class_names());
  }
  if (!test_hooks().sample_log.empty()) {  // which samples each step saw
    const std::string& f = test_hooks().sample_log;
    std::string path = session_->world() > 1 ? str(f, ".", session_->rank()) : f;
    sample_log_ = std::fopen(path.c_str(), "a");
    SPOTRAIN_CHECK(sample_log_, "cannot write SPOTRAIN_SAMPLE_LOG file ", path);
  }
  metrics_ = std::make_unique<MetricsSink>(cfg_.metrics, session_->rank() == 0);
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
      return snapshot_checkpoint(*t_.model, t_.sgd.get(), info, &snap_params_, &snap_momentum_);
    };
    path = ckpt_->write(at.step, snapshot, sync);
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
  t_.scaler->set_state(h.scaler);
  at.step = h.step;
  at.epoch = h.epoch;
  at.batch_in_epoch = h.batch_in_epoch;
  log_info(str("resumed from ", session_->rank() == 0 ? path : std::string("rank 0's checkpoint"),
               ": step ", at.step, ", epoch ", at.epoch + 1, ", batch ", at.batch_in_epoch));
  return at;
}

EvalResult Trainer::evaluate(const io::Dataset& data, int64_t batch_size) {
  session_->broadcast_buffers(*t_.model);  // rank 0's BN statistics, as DDP: one model
  return evaluate_model(*t_.model, data, data_.kind, batch_size, t_.runner->compute_dtype(),
                        &session_->worker(), cfg_.workers, cfg_.max_bad_fraction);
}

void Trainer::log_start(int64_t per_epoch, int64_t total_steps, int64_t epochs) {
  log_info(str("model ", cfg_.model, ": ", t_.model->summary()));
  if (session_->world() > 1)
    log_info(str("data parallel over ", session_->world(), " ranks (", session_->comm().name(),
                 "), global batch ", cfg_.batch_size * session_->world(), ", ",
                 t_.sync->num_buckets(), " gradient buckets of up to ", cfg_.bucket_mb,
                 " MB, compression ", cfg_.grad_compression));
  if (session_->backend().device() == Device::cuda) log_info(gpu_info_line(gpu_info()));
  log_info(str("backend ", session_->backend().name(), "; data ", data_.kind, ": ",
               data_.train->size(), " train / ", data_.test->size(), " test samples; ", epochs,
               " epoch(s) of ", per_epoch, " steps, batch ", cfg_.batch_size));
}

TrainResult Trainer::run() {
  Position at = resume();  // may change the per-rank batch (elastic resume)
  io::LoaderOptions lo;
  lo.batch_size = cfg_.batch_size;
  lo.train = true;
  lo.seed = cfg_.seed;
  lo.workers = cfg_.workers;
  lo.prefetch = cfg_.prefetch;
  lo.image_allocator = &session_->backend().host_staging_allocator();  // pinned on CUDA
  lo.augment = cfg_.augment;
  lo.max_bad_fraction = cfg_.max_bad_fraction;
  if (data_.train->encoded()) lo.image = image_transforms_for(*data_.train);
  lo.rank = session_->rank();
  lo.world = session_->world();
  lo.transforms = transforms_for(data_.kind, *data_.train, true, cfg_.augment);
  io::Loader loader(data_.train, lo);
  const int64_t per_epoch = loader.batches_per_epoch();
  const int64_t total_steps = cfg_.steps > 0 ? cfg_.steps : cfg_.epochs * per_epoch;
  const int64_t epochs = (total_steps + per_epoch - 1) / per_epoch;
  LrSchedule sched;
  sched.kind = cfg_.lr_schedule;
  sched.base_lr = cfg_.lr;
  sched.total_steps = total_steps;
  sched.warmup_steps = int64_t(std::llround(cfg_.warmup_epochs * double(per_epoch)));
  sched.milestones = {total_steps / 2, total_steps * 3 / 4};
  sched.validate();
  log_start(per_epoch, total_steps, epochs);

  if (at.batch_in_epoch >= per_epoch) at = Position{at.step, at.epoch + 1, 0};
  CommWorker& worker = session_->worker();
  StopPolicy stop(cfg_.max_wall_time, created_, t_.sync.get());
  TrainResult res;
  const double t_start = now_seconds();
  const int64_t first_step = at.step, first_epoch = at.epoch;
  double last_step_end = t_start;
  for (int64_t epoch = first_epoch; epoch < epochs && at.step < total_steps; ++epoch) {
    loader.start_epoch(epoch, epoch == first_epoch ? at.batch_in_epoch : 0);
    io::Batch b;
    Tally window, ep;
    double win_t0 = now_seconds(), ep_t0 = win_t0;
    while (at.step < total_steps && loader.next(b)) {
      const float lr = sched.at(at.step);
      worker.set_step(at.step + 1);  // 1-based, as in the progress lines
      inject_fault(session_->rank(), at.step + 1);
      if (sample_log_) {
        std::fprintf(sample_log_, "%lld", static_cast<long long>(at.step + 1));
        for (int64_t id : b.sample_ids) std::fprintf(sample_log_, " %lld", static_cast<long long>(id));
        std::fprintf(sample_log_, "\n");
        std::fflush(sample_log_);
      }
      stop.before_step();
      StepResult sr = t_.runner->run(b.images, b.labels.data(), lr, cfg_.label_smoothing);
      at = Position{at.step + 1, epoch, b.batch_index + 1};
      window.add(sr.loss, int64_t(b.labels.size()));
      ep.add(sr.loss, int64_t(b.labels.size()));
      if (at.step % cfg_.log_every == 0 || at.step == total_steps || at.batch_in_epoch == per_epoch) {
        window.sum_over(worker, "the logged loss");  // the global batch's figures
        double t = now_seconds();
        double ips = double(window.n) / std::max(1e-9, t - win_t0);
        double eta = (t - t_start) / double(at.step - first_step) * double(total_steps - at.step);
        const LossScaler& sc = *t_.scaler;
        log_info(str("epoch ", epoch + 1, "/", epochs, " step ", at.step, "/", total_steps,
                     " loss ", fmt_fixed(window.mean_loss(), 4), " acc ",
                     fmt_fixed(100.0 * window.accuracy(), 2), "% lr ", fmt_fixed(lr, 5), " img/s ",
                     fmt_fixed(ips, 1), " eta ", fmt_duration(eta),
                     sc.enabled() ? str(" scale ", sc.scale(), " skipped ", sc.state().skipped_steps)
                                  : std::string()));
        nlohmann::json j{{"epoch", epoch + 1}, {"step", at.step}, {"loss", window.mean_loss()},
                         {"train_top1", window.accuracy()}, {"lr", lr}, {"images_per_sec", ips}};
        if (sc.enabled()) {
          j["loss_scale"] = sc.scale();
          j["skipped_steps"] = sc.state().skipped_steps;
        }
        metrics_->write("step", j);
        window = Tally{};
        win_t0 = now_seconds();
      }
      const double step_end = now_seconds();
      const double step_seconds = step_end - last_step_end;
      last_step_end = step_end;
      // What writing a checkpoint costs, once one has been written (0 before).
      const double ckpt_seconds = ckpt_ && ckpt_->last_write_seconds() > 0
                                      ? ckpt_->last_snapshot_seconds() + ckpt_->last_write_seconds()
                                      : 0.0;
      const std::string reason = stop.after_step(step_seconds, ckpt_seconds);
      if (!reason.empty() && at.step < total_steps) {
        SPOTRAIN_CHECK(!cfg_.ckpt_dir.empty(), "stopped by ", reason, " at step ", at.step,
                       " with no --ckpt-dir: nothing was saved");
        res.checkpoint = write_checkpoint(at, /*sync=*/true);
        log_info(str("stopped by ", reason, " after step ", at.step, "; resume with --resume auto"));
        res.stopped = true;
        res.steps = at.step;
        res.seconds = now_seconds() - t_start;
        return res;
      }
      // Periodic and epoch-end checkpoints: rank 0 alone decides and writes in the background.
      if (ckpt_) {
        ckpt_->poll();
        if (at.step < total_steps && ckpt_->due(at.step, at.batch_in_epoch == per_epoch))
          res.checkpoint = write_checkpoint(at, /*sync=*/false);
      }
    }
    const double ep_secs = now_seconds() - ep_t0;
    ep.sum_over(worker, "the epoch summary");  // the whole job's
    res.final_loss = ep.mean_loss();
    res.train_top1 = ep.accuracy();
    res.images_per_sec = double(ep.n) / std::max(1e-9, ep_secs);
    const bool final_epoch = !(epoch + 1 < epochs && at.step < total_steps);
    const bool eval_due =
        cfg_.eval_each_epoch && cfg_.eval_every > 0 && (epoch + 1) % cfg_.eval_every == 0;
    if (eval_due || final_epoch) {
      res.test = evaluate(*data_.test, std::max<int64_t>(cfg_.batch_size, 256));
      log_info(str("epoch ", epoch + 1, " done in ", fmt_duration(ep_secs), ": train loss ",
                   fmt_fixed(res.final_loss, 4), " train acc ", fmt_fixed(100 * res.train_top1, 2),
                   "% | test loss ", fmt_fixed(res.test.loss, 4), " top-1 ",
                   fmt_fixed(100 * res.test.top1, 2), "% top-5 ", fmt_fixed(100 * res.test.top5, 2),
                   "% (", res.test.samples, " images)"));
      metrics_->write("epoch", {{"epoch", epoch + 1}, {"step", at.step}, {"loss", res.final_loss},
                                {"train_top1", res.train_top1}, {"test_loss", res.test.loss},
                                {"test_top1", res.test.top1}, {"test_top5", res.test.top5},
                                {"lr", sched.at(at.step - 1)},
                                {"images_per_sec", res.images_per_sec},
                                {"epoch_seconds", ep_secs}});
    }
  }
  auto bad = loader.bad_samples();
  if (!bad.empty()) {
    std::string list;
    for (size_t i = 0; i < bad.size() && i < 20; ++i) list += "\n  " + bad[i].what;
    std::fprintf(stderr, "warning: rank %d skipped %zu unreadable training image(s):%s%s\n",
                 session_->rank(), bad.size(), list.c_str(), bad.size() > 20 ? "\n  ..." : "");
  }
  res.bad_images = int64_t(bad.size());
  res.steps = at.step;
  res.seconds = now_seconds() - t_start;
  res.skipped_steps = t_.scaler->state().skipped_steps;
  res.loss_scale = t_.scaler->scale();
  if (!cfg_.ckpt_dir.empty()) res.checkpoint = write_checkpoint(at, /*sync=*/true);
  return res;
}

}  // namespace spotrain
