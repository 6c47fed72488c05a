// Trainer (see trainer.h).
#include "engine/trainer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoints/checkpoint.h"
#include "engine/error.h"
#include "engine/log.h"
#include "engine/lr_schedule.h"
#include "io/loader.h"
#include "layers/resnet.h"

namespace spotrain {

namespace {

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

io::TransformOptions transforms_for(const std::string& kind, const io::Dataset& d, bool train,
                                    bool augment) {
  if (kind == "fashion-mnist") {
    auto t = io::fashion_mnist_transforms(train);
    if (!augment) {
      t.pad = 0;
      t.flip = false;
    }
    return t;
  }
  io::TransformOptions t;  // synthetic: plain scaling
  int c = d.image_shape().c;
  t.mean.assign(c, 0.5f);
  t.std.assign(c, 0.25f);
  return t;
}

}  // namespace

DataPair open_data(const std::string& spec, int64_t train_limit, int64_t test_limit,
                   uint64_t seed) {
  DataPair p;
  std::string kind = spec, arg;
  auto colon = spec.find(':');
  if (colon != std::string::npos) {
    kind = spec.substr(0, colon);
    arg = spec.substr(colon + 1);
  }
  if (kind == "fashion-mnist") {
    std::string dir = arg.empty() ? "/usr/share/datasets/fashion-mnist" : arg;
    p.train = io::load_idx_dataset(dir, "train");
    p.test = io::load_idx_dataset(dir, "test");
  } else if (kind == "synthetic") {
    p.train = io::make_synthetic_dataset(train_limit > 0 ? train_limit : 2048, {28, 28, 1}, 10, seed);
    p.test = io::make_synthetic_dataset(test_limit > 0 ? test_limit : 512, {28, 28, 1}, 10, seed + 1);
  } else {
    SPOTRAIN_THROW("unknown --data '", spec, "'; use fashion-mnist[:DIR] or synthetic");
  }
  p.kind = kind;
  if (train_limit > 0 && train_limit < p.train->size()) p.train = io::take_first(p.train, train_limit);
  if (test_limit > 0 && test_limit < p.test->size()) p.test = io::take_first(p.test, test_limit);
  return p;
}

Trainer::Trainer(const RunConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  data_ = open_data(cfg_.data, cfg_.train_limit, cfg_.test_limit, cfg_.seed);
  SPOTRAIN_CHECK(cfg_.batch_size <= data_.train->size(), "--batch-size ", cfg_.batch_size,
                 " is larger than the training set (", data_.train->size(), " samples)");
  BackendOptions bo;
  bo.threads = cfg_.threads;
  bo.deterministic = cfg_.deterministic;
  backend_ = make_backend(cfg_.device, bo);
  if (cfg_.precision == "tf32" && backend_->device() == Device::cpu)  // said once, at start
    log_info("note: tf32 is a GPU math mode; on the CPU it computes in fp32");
  ResNetOptions ro;
  ro.arch = cfg_.model;
  ro.num_classes = data_.train->num_classes();
  ro.in_channels = data_.train->image_shape().c;
  ro.zero_init_residual = cfg_.zero_init_residual;
  ro.grad_checkpoint = cfg_.grad_checkpoint;
  model_ = std::make_unique<Model>(build_resnet(ro), *backend_);
  model_->initialize(cfg_.seed);
  SgdOptions so;
  so.momentum = cfg_.momentum;
  so.nesterov = cfg_.nesterov;
  so.weight_decay = cfg_.weight_decay;
  so.decay_bn_and_bias = cfg_.decay_bn_and_bias;
  sgd_ = std::make_unique<Sgd>(*model_, so);
  Precision prec = parse_precision(cfg_.precision);
  LossScalerOptions lso;
  lso.enabled = prec == Precision::fp16;
  lso.static_scale = cfg_.loss_scale;
  lso.max_consecutive_overflows = cfg_.max_overflow_steps;
  scaler_ = std::make_unique<LossScaler>(lso);
  runner_ = std::make_unique<StepRunner>(*model_, *sgd_, *scaler_, prec);
  if (prec == Precision::fp16 && backend_->device() == Device::cpu)
    log_info("note: fp16 on the CPU stores fp16 and computes in fp32 (slow; for checking loss "
             "scaling). bf16 is the fast CPU choice.");
  if (!cfg_.ckpt_dir.empty()) {
    // Fail now, not after hours of training, when checkpoints cannot be written.
    std::error_code ec;
    std::filesystem::create_directories(cfg_.ckpt_dir, ec);
    std::string probe = cfg_.ckpt_dir + "/.write-test";
    std::ofstream f(probe);
    SPOTRAIN_CHECK(!ec && f.good(), "checkpoint directory ", cfg_.ckpt_dir,
                   " is not writable; pass a writable --ckpt-dir");
    f.close();
    std::filesystem::remove(probe, ec);
  }
  if (!cfg_.metrics.empty()) {
    metrics_ = std::fopen(cfg_.metrics.c_str(), "w");
    SPOTRAIN_CHECK(metrics_, "cannot write metrics file ", cfg_.metrics, ": ", std::strerror(errno));
  }
}

Trainer::~Trainer() {
  if (metrics_) std::fclose(metrics_);
}

EvalResult evaluate_model(Model& model, const io::Dataset& data, const std::string& data_kind,
                          int64_t batch_size, DType compute) {
  io::LoaderOptions lo;
  lo.batch_size = batch_size;
  lo.train = false;
  lo.transforms = transforms_for(data_kind, data, false, false);
  io::Loader loader(std::shared_ptr<const io::Dataset>(&data, [](const io::Dataset*) {}), lo);
  loader.start_epoch(0);
  io::Batch b;
  EvalResult r;
  double loss_sum = 0;
  int64_t top1 = 0, top5 = 0;
  Backend& be = model.backend();
  while (loader.next(b)) {
    Tensor logits = model.forward(be.upload_images(b.images, compute), /*training=*/false);
    LossResult l = be.softmax_xent(logits, b.labels.data(), 0.f, 1.f, nullptr);
    int64_t n = int64_t(b.labels.size());
    loss_sum += l.loss * double(n);
    top1 += l.top1;
    top5 += l.top5;
    r.samples += n;
  }
  if (r.samples > 0) {
    r.loss = loss_sum / double(r.samples);
    r.top1 = double(top1) / double(r.samples);
    r.top5 = double(top5) / double(r.samples);
  }
  return r;
}

EvalResult Trainer::evaluate(const io::Dataset& data, int64_t batch_size) {
  return evaluate_model(*model_, data, data_.kind, batch_size, runner_->compute_dtype());
}

TrainResult Trainer::run() {
  io::LoaderOptions lo;
  lo.batch_size = cfg_.batch_size;
  lo.train = true;
  lo.seed = cfg_.seed;
  lo.workers = cfg_.workers;
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

  log_info(str("model ", cfg_.model, ": ", model_->summary()));
  log_info(str("backend ", backend_->name(), "; data ", data_.kind, ": ", data_.train->size(),
               " train / ", data_.test->size(), " test samples; ", epochs, " epoch(s) of ",
               per_epoch, " steps, batch ", cfg_.batch_size));

  TrainResult res;
  int64_t step = 0;
  double t_start = now_seconds();
  for (int64_t epoch = 0; epoch < epochs && step < total_steps; ++epoch) {
    loader.start_epoch(epoch);
    io::Batch b;
    double win_loss = 0, ep_loss = 0;
    int64_t win_correct = 0, win_n = 0, ep_correct = 0, ep_n = 0;
    double win_t0 = now_seconds(), ep_t0 = win_t0;
    while (step < total_steps && loader.next(b)) {
      float lr = sched.at(step);
      StepResult sr = runner_->run(b.images, b.labels.data(), lr, cfg_.label_smoothing);
      const LossResult& l = sr.loss;
      ++step;
      int64_t n = int64_t(b.labels.size());
      win_loss += l.loss * double(n);
      ep_loss += l.loss * double(n);
      win_correct += l.top1;
      ep_correct += l.top1;
      win_n += n;
      ep_n += n;
      bool last = step == total_steps || b.batch_index + 1 == per_epoch;
      if (step % cfg_.log_every == 0 || last) {
        double t = now_seconds();
        double ips = double(win_n) / std::max(1e-9, t - win_t0);
        double elapsed = t - t_start;
        double eta = elapsed / double(step) * double(total_steps - step);
        log_info(str("epoch ", epoch + 1, "/", epochs, " step ", step, "/", total_steps,
                     " loss ", fmt_fixed(win_loss / double(win_n), 4), " acc ",
                     fmt_fixed(100.0 * double(win_correct) / double(win_n), 2), "% lr ",
                     fmt_fixed(lr, 5), " img/s ", fmt_fixed(ips, 1), " eta ", fmt_duration(eta),
                     scaler_->enabled()
                         ? str(" scale ", scaler_->scale(), " skipped ", scaler_->state().skipped_steps)
                         : std::string()));
        if (metrics_) {
          nlohmann::json j{{"type", "step"}, {"epoch", epoch + 1}, {"step", step},
                           {"loss", win_loss / double(win_n)},
                           {"train_top1", double(win_correct) / double(win_n)},
                           {"lr", lr}, {"images_per_sec", ips}};
          if (scaler_->enabled()) {
            j["loss_scale"] = scaler_->scale();
            j["skipped_steps"] = scaler_->state().skipped_steps;
          }
          std::fprintf(metrics_, "%s\n", j.dump().c_str());
          std::fflush(metrics_);
        }
        win_loss = 0;
        win_correct = win_n = 0;
        win_t0 = now_seconds();
      }
    }
    double ep_secs = now_seconds() - ep_t0;
    res.final_loss = ep_n ? ep_loss / double(ep_n) : 0;
    res.train_top1 = ep_n ? double(ep_correct) / double(ep_n) : 0;
    res.images_per_sec = double(ep_n) / std::max(1e-9, ep_secs);
    bool final_epoch = !(epoch + 1 < epochs && step < total_steps);
    if (cfg_.eval_each_epoch || final_epoch) {
      res.test = evaluate(*data_.test, std::max<int64_t>(cfg_.batch_size, 256));
      log_info(str("epoch ", epoch + 1, " done in ", fmt_duration(ep_secs), ": train loss ",
                   fmt_fixed(res.final_loss, 4), " train acc ", fmt_fixed(100 * res.train_top1, 2),
                   "% | test loss ", fmt_fixed(res.test.loss, 4), " top-1 ",
                   fmt_fixed(100 * res.test.top1, 2), "% top-5 ", fmt_fixed(100 * res.test.top5, 2),
                   "% (", res.test.samples, " images)"));
      if (metrics_) {
        nlohmann::json j{{"type", "epoch"}, {"epoch", epoch + 1}, {"step", step},
                         {"loss", res.final_loss}, {"train_top1", res.train_top1},
                         {"test_loss", res.test.loss}, {"test_top1", res.test.top1},
                         {"test_top5", res.test.top5}, {"lr", sched.at(step - 1)},
                         {"images_per_sec", res.images_per_sec}, {"epoch_seconds", ep_secs}};
        std::fprintf(metrics_, "%s\n", j.dump().c_str());
        std::fflush(metrics_);
      }
    }
  }
  res.steps = step;
  res.seconds = now_seconds() - t_start;
  res.skipped_steps = scaler_->state().skipped_steps;
  res.loss_scale = scaler_->scale();
  if (!cfg_.ckpt_dir.empty()) {
    char name[32];
    std::snprintf(name, sizeof name, "ckpt-%08lld.h5", static_cast<long long>(step));
    res.checkpoint = cfg_.ckpt_dir + "/" + name;
    CheckpointInfo info;
    info.config_json = cfg_.to_json();
    info.model = cfg_.model;
    info.epoch = epochs;
    info.global_step = step;
    info.num_classes = data_.train->num_classes();
    info.in_channels = data_.train->image_shape().c;
    save_checkpoint(res.checkpoint, *model_, sgd_.get(), info);
    log_info(str("checkpoint written: ", res.checkpoint));
  }
  return res;
}

}  // namespace spotrain
