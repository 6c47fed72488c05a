// Trainer (see trainer.h).
#include "run/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <vector>

#include "comm/hosts.h"
#include "core/clock.h"
#include "core/environment.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/device_info.h"
#include "observe/progress.h"
#include "run/rebalance.h"
#include "run/resume.h"
#include "run/setup.h"
#include "run/stop_policy.h"
#include "spot/preemption.h"

namespace spotrain {

namespace {

// --prometheus: the file of this node's first rank, labelled with the run folder's name.
std::unique_ptr<PrometheusExport> make_prometheus(const RunConfig& cfg, Session& session,
                                                  const MetricsSink& metrics) {
  if (cfg.prometheus.empty() || session.comm().local_rank() != 0) return nullptr;
  std::string run = cfg.ckpt_dir.empty() ? std::string("spotrain") : cfg.ckpt_dir;
  while (run.size() > 1 && run.back() == '/') run.pop_back();
  run = run.substr(run.find_last_of('/') + 1);
  return std::make_unique<PrometheusExport>(
      cfg.prometheus, str("run=\"", prom_escape(run), "\",rank=\"", session.rank(), "\""),
      session.rank() == 0 ? std::max<int64_t>(0, metrics.previous_starts()) : -1);
}

// The metrics' "start" record: where and how the run ran (backend, ranks, GPU and CUDA
// library versions, every setting, where the checkpoints are kept).
void write_start_record(MetricsSink& metrics, Session& session, const RunConfig& cfg,
                        const RunStorage& storage) {
  if (!metrics.enabled()) return;
  nlohmann::json j{{"backend", session.backend().name()}, {"ranks", session.world()},
                   {"comm", session.comm().name()}, {"precision", cfg.precision},
                   {"config", nlohmann::json::parse(cfg.to_json())}};
  if (!cfg.ckpt_dir.empty())
    j["storage"] = {{"shared", storage.shared}, {"writers", storage.writers}, {"rank", session.rank()}};
  for (auto& [k, v] : gpu_info_fields(gpu_info())) j["machine"][k] = v;
  metrics.write("start", j);
}

// SPOTRAIN_SAMPLE_LOG (core/environment.h): which samples each step saw, a file per rank.
FILE* open_sample_log(const Session& session) {
  const std::string& f = test_hooks().sample_log;
  if (f.empty()) return nullptr;
  const std::string path = session.world() > 1 ? str(f, ".", session.rank()) : f;
  FILE* out = std::fopen(path.c_str(), "a");
  SPOTRAIN_CHECK(out, "cannot write SPOTRAIN_SAMPLE_LOG file ", path);
  return out;
}

void log_samples(FILE* f, int64_t step, const std::vector<int64_t>& ids) {
  std::fprintf(f, "%lld", static_cast<long long>(step));
  for (int64_t id : ids) std::fprintf(f, " %lld", static_cast<long long>(id));
  std::fprintf(f, "\n");
  std::fflush(f);
}

// Steps queued whose figures the host has not read yet (StepRunner reads a step back during
// the next one). They reach the progress line in order, at the same point on every rank (its
// figures are summed over ranks): after each step, and after a settle that all ranks make
// (an epoch's end, the last step, a stop).
class PendingFigures {
 public:
  struct Step {
    StepFacts facts;
    StepTimes phases;
    bool timed = false;
  };
  PendingFigures(StepRunner& runner, Progress& progress) : runner_(runner), progress_(progress) {}
  Step& add() { return steps_.emplace_back(); }  // a deque: the reference stays valid
  void account() {
    for (const StepResult& r : runner_.take_results()) {
      SPOTRAIN_CHECK(!steps_.empty(), "internal: a step's figures without its step");
      Step s = std::move(steps_.front());
      steps_.pop_front();
      s.facts.loss = r.loss;
      s.facts.done_at = r.done_at;
      s.facts.comm_wait = r.comm_wait;
      s.facts.device_compute = r.device_compute;
      s.facts.phases = s.timed ? &s.phases : nullptr;
      progress_.step(s.facts);
    }
  }
  void settle() {
    runner_.settle();
    account();
  }

 private:
  StepRunner& runner_;
  Progress& progress_;
  std::deque<Step> steps_;
};

}  // namespace

struct Trainer::Loop {
  Loop(Trainer& tr, const Schedule& schedule, int64_t first_step)
      : s(schedule),
        stop(tr.cfg_.max_wall_time, tr.created_, tr.t_.sync.get(), &tr.session_->worker()),
        progress(tr.session_->worker(), *tr.metrics_, tr.prom_.get(), *tr.t_.scaler,
                 tr.session_->backend().allocator(), *tr.telemetry_, tr.cfg_.log_every,
                 tr.cfg_.workers, schedule.epochs, schedule.total_steps, first_step),
        pending(*tr.t_.runner, progress) {}
  Schedule s;
  StopPolicy stop;
  Progress progress;
  PendingFigures pending;
  double started = now_seconds();
  double first_step_at = 0;  // when this process's first step was done (its start-up)
  std::unique_ptr<RankWatch> rank_watch;  // several ranks: each one's times, the stragglers
  std::unique_ptr<Rebalancer> rebalance;  // what is done about them: shares that follow rates,
  std::unique_ptr<LeaveRule> leave;       // and a host left behind
};

namespace {

RunConfig validated(const RunConfig& cfg) {
  cfg.validate();
  return cfg;
}

}  // namespace

Trainer::Trainer(const RunConfig& cfg) : cfg_(validated(cfg)), created_(now_seconds()) {
  // From the start: a stop signal during set-up or resume stops the run after its first step,
  // with a checkpoint and 75, instead of killing it (143, which no launcher retries).
  install_stop_handlers();
  session_ = std::make_unique<Session>(session_options(cfg_));
  const int world = session_->world();
  if (world > 1) check_ranks_agree(cfg_, *session_);
  if (!cfg_.plan.empty()) read_plan(cfg_.plan);  // a bad --plan: before the data and the model
  data_ = open_data(cfg_.data, cfg_.train_limit, cfg_.test_limit, cfg_.seed, cfg_.image_size);
  SPOTRAIN_CHECK(cfg_.batch_size <= data_.train->size(), "--batch-size ", cfg_.batch_size,
                 " is larger than the training set (", data_.train->size(), " samples)");
  // The run folder once the data is known good, on each rank that writes a copy of the
  // checkpoints (rank 0 alone where every rank sees the same folder): locked, refused when it
  // holds another run, its train.log the log's copy.
  if (!cfg_.ckpt_dir.empty()) {
    storage_ = find_storage(cfg_.ckpt_dir, cfg_.ckpt_storage, *session_);
    log_info(str("run folder ", cfg_.ckpt_dir, ": ", storage_.describe(world)));
    if (storage_.writer) folder_ = std::make_unique<RunFolder>(cfg_);
  }
  if (world > 1)  // every rank's host, as the straggler lines, the shares and the leave rule name it
    session_->worker().run("the ranks' host names", [&] { hosts_ = gather_host_labels(session_->comm()); });
  try {  // where training starts, and so the global batch and this rank's share of it
    start_ = find_resume_point(cfg_, *session_, storage_);
    split_ = run_split(cfg_, start_, world);
    seed_shares();
    SPOTRAIN_CHECK(split_.global() <= data_.train->size(), "checkpoint ", start_.checkpoint,
                   " was trained at a global batch of ", split_.global(), ", larger than the training set here (",
                   data_.train->size(), " samples of ", cfg_.data, "); resume it on the data it was trained on");
  } catch (const std::exception& e) {
    log_to_file(str("error: ", e.what()));  // the run folder's train.log closes as this unwinds
    throw;
  }
  TrainingSpec spec =
      training_spec(cfg_, split_, session_->rank(), data_.train->num_classes(), data_.train->image_shape().c);
  spec.initialize = false;  // below: from a checkpoint, or drawn when there is none
  // Said once, at start: how this backend computes the precision asked for.
  const std::string note = session_->backend().precision_note(compute_dtype(spec.precision), spec.precision == Precision::tf32);
  if (!note.empty()) log_info("note: " + note);
  t_ = session_->make_training(spec);
  if (cfg_.ema_decay > 0) ema_ = std::make_unique<WeightEma>(*t_.model, cfg_.ema_decay);
  checkpoints_ = std::make_unique<RunCheckpoints>(cfg_, split_, *session_, t_, ema_.get(), *data_.train, storage_);
  sample_log_ = open_sample_log(*session_);
  // The metrics: rank 0's, and in each copy of the run folder its writer's.
  const bool in_folder = cfg_.metrics == "auto" && storage_.writer;
  metrics_ = std::make_unique<MetricsSink>(cfg_.metrics_path(), session_->rank() == 0 || in_folder);
  telemetry_ = std::make_unique<Telemetry>(session_->backend().gpu_pci_bus_id());
  prom_ = make_prometheus(cfg_, *session_, *metrics_);
  checkpoints_->report_to(metrics_.get(), prom_.get());
  if (!cfg_.preempt_notice.empty()) {  // each node asks its own metadata service
    notices_ = std::make_unique<PreemptionWatcher>(cfg_.preempt_notice, cfg_.preempt_poll);
    log_info(str("watching for preemption notices: ", cfg_.preempt_notice, " every ",
                 cfg_.preempt_poll, " s"));
  }
  write_start_record(*metrics_, *session_, cfg_, storage_);
  // The state: the checkpoint's (no weights drawn only to be overwritten), else fresh weights,
  // or --init-from's.
  try {
    if (start_.found) {
      load_resume_point(start_, *session_, t_, ema_.get());
    } else {
      session_->initialize_model(*t_.model, spec.seed);
      if (ema_) ema_->restart();  // made before the weights were
      init_from_weights(cfg_, *session_, t_, ema_.get());
    }
  } catch (const std::exception& e) {
    log_to_file(str("error: ", e.what()));
    throw;
  }
}

Trainer::~Trainer() {
  if (sample_log_) std::fclose(sample_log_);
}

EvalResult Trainer::evaluate(const io::Dataset& data, int64_t batch_size) {
  session_->broadcast_buffers(*t_.model);  // rank 0's BN statistics, as DDP: one model
  return evaluate_model(*t_.model, data, data_.kind, batch_size, t_.runner->compute_dtype(),
                        &session_->worker(), cfg_.workers, cfg_.max_bad_fraction);
}

Trainer::Schedule Trainer::schedule(int64_t per_epoch) const {
  Schedule p;
  p.per_epoch = per_epoch;
  // Steps and the samples they consume must fit the 64-bit counters, with room for the
  // schedule's arithmetic (a milestone is 3/4 of the total).
  const int64_t global_batch = split_.global();
  const int64_t most_steps = std::numeric_limits<int64_t>::max() / 4 / std::max<int64_t>(1, global_batch);
  SPOTRAIN_CHECK(cfg_.steps <= most_steps, "--steps ", cfg_.steps, " is more than the step and sample counters hold (",
                 most_steps, " steps at a global batch of ", global_batch, ")");
  SPOTRAIN_CHECK(cfg_.steps > 0 || cfg_.epochs <= most_steps / per_epoch, "--epochs ", cfg_.epochs,
                 " is more than the step and sample counters hold (", most_steps / per_epoch, " epochs of ",
                 per_epoch, " steps at a global batch of ", global_batch, ")");
  p.total_steps = cfg_.steps > 0 ? cfg_.steps : cfg_.epochs * per_epoch;
  p.epochs = (p.total_steps + per_epoch - 1) / per_epoch;
  p.lr.kind = cfg_.lr_schedule;
  p.lr.base_lr = cfg_.lr_per_256 > 0 ? cfg_.lr_per_256 * float(global_batch) / 256.f : cfg_.lr;
  p.lr.total_steps = p.total_steps;
  p.lr.warmup_steps = int64_t(std::llround(cfg_.warmup_epochs * double(per_epoch)));
  p.lr.milestones = {p.total_steps / 2, p.total_steps * 3 / 4};
  p.lr.end_lr = cfg_.lr_end;
  p.lr.poly_power = cfg_.lr_poly_power;
  p.lr.validate();
  return p;
}

void Trainer::log_start(const Schedule& p) {
  log_info(str("model ", cfg_.model, ": ", t_.model->summary()));
  const int64_t global = split_.global();
  if (session_->world() > 1)
    log_info(str("data parallel over ", session_->world(), " ranks (", session_->comm().name(), "), global batch ",
                 global, ", ", t_.sync->num_buckets(), " gradient buckets of up to ", cfg_.bucket_mb,
                 " MB, compression ", cfg_.grad_compression));
  const std::string device = session_->backend().device_line();
  if (!device.empty()) log_info(device);
  if (cfg_.lr_per_256 > 0)
    log_info(str("learning rate ", fmt_fixed(p.lr.base_lr, 5), " = --lr-per-256 ", cfg_.lr_per_256, " x global batch ",
                 global, " / 256"));
  if (ema_) log_info(str("keeping a moving average of the weights (--ema-decay ", cfg_.ema_decay, ")"));
  if (cfg_.optimizer == "lars")
    log_info(str("optimizer LARS: trust coefficient ", cfg_.lars_trust, ", epsilon ", cfg_.lars_epsilon,
                 ", momentum ", cfg_.momentum, ", weight decay ", cfg_.weight_decay,
                 cfg_.decay_bn_and_bias ? "" : "; BN and biases left out of both"));
  const int mine = split_.count(session_->rank());
  log_info(str("backend ", session_->backend().name(), "; data ", data_.kind, ": ", data_.train->size(), " train / ",
               data_.test->size(), " test samples; ", p.epochs, " epoch(s) of ", p.per_epoch, " steps, batch ",
               split_.micro,
               mine > 1 || !split_.even()
                   ? str(" x ", mine, " micro-batches per step (",
                         split_.even() ? std::string("--accum-steps") : split_.text(), "; global batch ", global, ")")
                   : std::string()));
}

void Trainer::begin(Loop& loop) {
  if (start_.found) {
    checkpoints_->after_resume(start_.at, start_.from_named_file);
    if (prom_) prom_->checkpoint(start_.checkpoint, true);
  }
  record_resume(*metrics_, start_, session_->world());
  log_start(loop.s);
  const int world = session_->world();
  if (world == 1 || test_hooks().no_rank_watch) return;
  // Each rank's times, at every progress line.
  loop.rank_watch = std::make_unique<RankWatch>(world, session_->rank(), cfg_.straggler_threshold, hosts_);
  loop.rank_watch->set_shares(split_.counts);
  loop.progress.watch_ranks(loop.rank_watch.get());
  loop.leave = std::make_unique<LeaveRule>(cfg_, session_->worker());
  const std::string why_even = why_shares_stay();
  if (why_even.empty())
    loop.rebalance = std::make_unique<Rebalancer>(split_);
  else if (cfg_.straggler_action != "warn")
    log_info(str("--straggler-action ", cfg_.straggler_action, ": shares of the global batch stay even: ", why_even));
}

std::string Trainer::why_shares_stay() const {
  if (session_->world() == 1) return "one rank";
  if (cfg_.straggler_action == "warn") return "--straggler-action warn";
  if (cfg_.deterministic)
    return "--deterministic (a share that follows the ranks' rates changes the order of the gradient's sum)";
  return Rebalancer::why_shares_stay(split_);
}

void Trainer::seed_shares() {
  // The health gate's rates (SPOTRAIN_HOST_RATES from mpirun.sh), where it measured every host.
  const std::map<std::string, double>& known = launcher_settings().host_rates;
  if (known.empty() || !why_shares_stay().empty()) return;
  std::vector<double> rates;
  for (const std::string& h : hosts_) {
    const auto it = std::find_if(known.begin(), known.end(), [&](const auto& k) { return same_host(k.first, h); });
    if (it == known.end()) return;  // a host the gate did not measure: an even start
    rates.push_back(it->second);
  }
  const BatchSplit seeded = split_by_rate(split_.global(), split_.micro, rates, Rebalancer::kMargin);
  if (seeded == split_) return;
  log_info(str("shares of the global batch start from the health gate's rates: ", seeded.text(), " (",
               split_.text(), " evenly)"));
  split_ = seeded;
}

TrainPosition Trainer::step(Loop& loop, io::Loader& loader, io::Batch& b, int64_t epoch,
                            double data_wait, TrainPosition at) {
  const float lr = loop.s.lr.at(at.step);
  session_->worker().set_step(at.step + 1);  // 1-based, as in the progress lines
  inject_fault(session_->rank(), at.step + 1);  // SPOTRAIN_FAULT (core/environment.h)
  loop.stop.before_step();
  checkpoints_->before_step(TrainPosition{at.step + 1, epoch, b.batch_index + 1},
                            b.batch_index + 1 == loop.s.per_epoch, loop.s.total_steps);
  PendingFigures::Step& s = loop.pending.add();
  s.timed = loop.progress.due_for_phases(at.step + 1);
  // The step's micro-batches (this rank's share of the global batch), each queued as it comes.
  int64_t images = 0;
  std::vector<int64_t> ids;  // SPOTRAIN_SAMPLE_LOG: the step's samples, in one line
  for (int j = 0; j < t_.runner->accum_steps(); ++j) {
    if (j > 0) {
      const double t0 = now_seconds();
      SPOTRAIN_CHECK(loader.next(b) && b.micro == j, "internal: step ", at.step + 1,
                     " lacks micro-batch ", j);
      data_wait += now_seconds() - t0;
    }
    if (sample_log_) ids.insert(ids.end(), b.sample_ids.begin(), b.sample_ids.end());
    images += int64_t(b.labels.size());
    const LabelMix mix{b.labels_b.data(), b.lam.data()};
    t_.runner->queue(b.images, b.labels.data(), lr, cfg_.label_smoothing, s.timed ? &s.phases : nullptr,
                     b.lam.empty() ? nullptr : &mix, &b.norm);
  }
  if (sample_log_) log_samples(sample_log_, at.step + 1, ids);
  if (ema_) ema_->update();
  session_->backend().save_kernel_choices();  // the first steps' timed choices, for a restart
  at = TrainPosition{at.step + 1, epoch, b.batch_index + 1};
  // before any other collective: what a survivor would save
  checkpoints_->step_done(settled(at, loop.s.per_epoch));
  s.facts.step = at.step;
  s.facts.epoch = epoch;
  s.facts.lr = lr;
  s.facts.batch = images;
  s.facts.epoch_end = at.batch_in_epoch == loop.s.per_epoch;
  s.facts.data_wait = data_wait;
  if (s.facts.epoch_end || at.step >= loop.s.total_steps) t_.runner->settle();
  loop.pending.account();
  if (loop.first_step_at == 0) loop.first_step_at = now_seconds();
  return at;
}

TrainResult Trainer::run() {
  io::Loader loader(data_.train, loader_options(cfg_, split_, data_, *session_));
  const Schedule p = schedule(loader.batches_per_epoch());
  TrainPosition at = start_.at;
  if (at.batch_in_epoch >= p.per_epoch) at = TrainPosition{at.step, at.epoch + 1, 0};
  Loop loop(*this, p, at.step);
  begin(loop);
  TrainResult res;
  const int64_t first_epoch = at.epoch;
  for (int64_t epoch = first_epoch; epoch < p.epochs && at.step < p.total_steps; ++epoch) {
    loader.start_epoch(epoch, epoch == first_epoch ? at.batch_in_epoch : 0);
    loop.progress.start_epoch();
    io::Batch b;
    while (at.step < p.total_steps) {
      const double wait_t0 = now_seconds();  // the time this step waits for its batch
      if (!loader.next(b)) break;
      at = step(loop, loader, b, epoch, now_seconds() - wait_t0, at);
      const std::string why = after_step(loop, loader, at);
      if (!why.empty() && at.step < p.total_steps) return stop_early(loop, settled(at, p.per_epoch), why, res);
      const std::string path = checkpoints_->after_step(settled(at, p.per_epoch), at.batch_in_epoch == p.per_epoch,
                                                        loop.progress.last_step_seconds(),
                                                        loop.progress.steady_step_seconds(), p.total_steps);
      if (!path.empty()) res.checkpoint = path;
    }
    loop.pending.settle();
    end_epoch(loop, epoch, !(epoch + 1 < p.epochs && at.step < p.total_steps), at.step, res);
  }
  return finish(loop, loader, at, res);
}

std::string Trainer::after_step(Loop& loop, io::Loader& loader, const TrainPosition& at) {
  const std::string why = loop.stop.after_step(loop.progress.last_step_seconds(),
                                               loop.progress.steady_step_seconds(), checkpoints_->seconds());
  RankWatch::Window w;
  if (!why.empty() || !loop.rank_watch || !loop.progress.take_rank_window(&w)) return why;
  if (loop.rebalance)
    if (const std::optional<BatchSplit> next = loop.rebalance->weigh(w, split_)) reshare(loop, loader, at, *next);
  return weigh_stragglers(loop, w, at.step);
}

void Trainer::reshare(Loop& loop, io::Loader& loader, const TrainPosition& at, const BatchSplit& next) {
  split_ = next;  // what the checkpoints record from now on
  const int rank = session_->rank();
  t_.runner->set_accum_steps(split_.count(rank), split_.units());
  loader.set_share(split_.micro, split_.units(), split_.first(rank), split_.count(rank));
  if (at.batch_in_epoch < loop.s.per_epoch) loader.start_epoch(at.epoch, at.batch_in_epoch);
  loop.rank_watch->set_shares(split_.counts);
  loop.rank_watch->skip_next();  // the next step waits for the loader's restart
  log_info(loop.rebalance->last_line());
  nlohmann::json rec = loop.rebalance->last_record();
  rec["step"] = at.step;
  rec["hosts"] = loop.rank_watch->hosts();
  metrics_->write("shares", rec);
}

TrainResult Trainer::finish(Loop& loop, io::Loader& loader, const TrainPosition& at, TrainResult res) {
  report_bad_images(loader, res);
  res.steps = at.step;
  res.seconds = now_seconds() - loop.started;
  res.skipped_steps = t_.scaler->state().skipped_steps;
  res.loss_scale = t_.scaler->scale();
  if (!cfg_.ckpt_dir.empty()) res.checkpoint = checkpoints_->write(settled(at, loop.s.per_epoch), /*sync=*/true);
  metrics_->write("end", {{"step", at.step}, {"checkpoint", res.checkpoint},
                          {"test_top1", res.test.top1}, {"seconds", res.seconds}});
  if (prom_) prom_->finished();
  return res;
}

TrainResult Trainer::stop_early(Loop& loop, const TrainPosition& at, const std::string& why,
                                TrainResult res) {
  SPOTRAIN_CHECK(!cfg_.ckpt_dir.empty(), "stopped by ", why, " at step ", at.step,
                 " with no --ckpt-dir: nothing was saved");
  loop.pending.settle();
  res.checkpoint = checkpoints_->write(at, /*sync=*/true);
  log_info(str("stopped by ", why, " after step ", at.step, "; resume with --resume auto"));
  metrics_->write("stop", {{"step", at.step}, {"reason", why}, {"checkpoint", res.checkpoint}});
  if (prom_) prom_->finished();
  res.stopped = true;
  res.steps = at.step;
  res.seconds = now_seconds() - loop.started;
  return res;
}

// After an epoch: its figures over all ranks, then evaluation when due (and always after the
// last epoch), logged and recorded.
void Trainer::end_epoch(Loop& loop, int64_t epoch, bool last_epoch, int64_t step, TrainResult& res) {
  double secs = 0;
  const Tally ep = loop.progress.end_epoch(&secs);
  res.final_loss = ep.mean_loss();
  res.train_top1 = ep.accuracy();
  res.images_per_sec = double(ep.images) / std::max(1e-9, secs);
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
                     {"lr", loop.s.lr.at(step - 1)}, {"images_per_sec", res.images_per_sec},
                     {"epoch_seconds", secs}};
  if (ema_) {
    rec["ema_test_loss"] = res.ema_test.loss;
    rec["ema_test_top1"] = res.ema_test.top1;
    rec["ema_test_top5"] = res.ema_test.top5;
  }
  metrics_->write("epoch", rec);
}

std::string Trainer::weigh_stragglers(Loop& loop, const RankWatch::Window& w, int64_t step) {
  LeaveInputs in;
  in.step = step;
  in.steps_left = loop.s.total_steps - step;
  in.split = &split_;
  if (loop.rebalance) in.rates = &loop.rebalance->rates();
  in.startup_s = loop.first_step_at - created_;
  in.checkpoint_s = checkpoints_->seconds();
  if (metrics_->enabled()) in.metrics_path = cfg_.metrics_path();
  const std::string why = loop.leave->weigh(*loop.rank_watch, w, in);
  if (!why.empty())  // the launcher's word (mpirun.sh reads the record, not the line)
    metrics_->announce("leave", {{"step", step}, {"host", loop.leave->leaving_host()},
                                 {"message", loop.leave->last_line()}});
  return why;
}

void Trainer::report_bad_images(io::Loader& loader, TrainResult& res) {
  auto bad = loader.bad_samples();
  res.bad_images = int64_t(bad.size());
  if (bad.empty()) return;
  // One line, the first image in it: each was named as it was met (loader.cpp), and a log's
  // last line is what people and schedulers read.
  std::fprintf(stderr, "warning: rank %d skipped %zu unreadable training image(s); the first: %s\n",
               session_->rank(), bad.size(), bad.front().what.c_str());
}

}  // namespace spotrain
