// Trainer (see trainer.h).
#include "engine/trainer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <filesystem>
#include <fstream>

#include "checkpoints/checkpoint.h"
#include "checkpoints/preemption.h"
#include "engine/error.h"
#include "engine/log.h"
#include "engine/lr_schedule.h"
#include "engine/rank_backend.h"
#include "io/image_folder.h"
#include "io/loader.h"
#include "kernels/cuda/device_info.h"
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
  io::TransformOptions t;
  if (d.encoded()) return t;  // imagefolder / shards: the Loader's ImageTransformOptions apply
  // synthetic: plain scaling
  int c = d.image_shape().c;
  t.mean.assign(c, 0.5f);
  t.std.assign(c, 0.25f);
  return t;
}

// Test hook for the fault-tolerance tests: SPOTRAIN_FAULT=die:RANK:STEP kills that rank at
// that step (SIGKILL, as a crashed or preempted node); hang:RANK:STEP makes it sleep forever;
// term:RANK:STEP sends it SIGTERM.
void inject_fault(int rank, int64_t step) {
  static const char* spec = std::getenv("SPOTRAIN_FAULT");
  if (!spec) return;
  char kind[8] = {0};
  int r = -1;
  long long s = -1;
  if (std::sscanf(spec, "%7[a-z]:%d:%lld", kind, &r, &s) != 3 || r != rank || s != step) return;
  std::fprintf(stderr, "rank %d: SPOTRAIN_FAULT %s at step %lld\n", rank, kind, s);
  std::fflush(stderr);
  if (std::string(kind) == "die") raise(SIGKILL);
  if (std::string(kind) == "term") raise(SIGTERM);  // as a spot preemption notice
  if (std::string(kind) == "hang")
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace

io::ImageTransformOptions image_transforms_for(const io::Dataset& d) {
  io::ImageTransformOptions t;
  t.out_size = d.image_shape().h;
  t.resize = int(std::lround(t.out_size * 256.0 / 224.0));
  return t;
}

DataPair open_data(const std::string& spec, int64_t train_limit, int64_t test_limit,
                   uint64_t seed, int image_size, bool with_test) {
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
  } else if (kind == "imagefolder") {
    SPOTRAIN_CHECK(!arg.empty(), "--data imagefolder:DIR needs a directory (DIR/train/<class>/*.JPEG)");
    p.train = io::open_image_folder(arg + "/train", {}, image_size);
    if (with_test) p.test = io::open_image_folder(arg + "/val", p.train->class_names(), image_size);
  } else if (kind == "shards") {
    SPOTRAIN_CHECK(!arg.empty(), "--data shards:DIR needs a directory written by `spotrain data pack`");
    p.train = io::open_shards(arg + "/train", image_size);
    if (with_test) {
      p.test = io::open_shards(arg + "/val", image_size);
      SPOTRAIN_CHECK(p.train->class_names() == p.test->class_names(), arg, "/train and ", arg,
                     "/val list different classes; pack them from one folder");
    }
  } else if (kind == "synthetic") {
    p.train = io::make_synthetic_dataset(train_limit > 0 ? train_limit : 2048, {28, 28, 1}, 10, seed);
    p.test = io::make_synthetic_dataset(test_limit > 0 ? test_limit : 512, {28, 28, 1}, 10, seed + 1);
  } else {
    SPOTRAIN_THROW("unknown --data '", spec,
                    "'; use fashion-mnist[:DIR], imagefolder:DIR, shards:DIR or synthetic");
  }
  p.kind = kind;
  if (train_limit > 0 && train_limit < p.train->size()) p.train = io::take_first(p.train, train_limit);
  if (p.test && test_limit > 0 && test_limit < p.test->size())
    p.test = io::take_first(p.test, test_limit);
  return p;
}

Trainer::Trainer(const RunConfig& cfg) : cfg_(cfg), created_(now_seconds()) {
  cfg_.validate();
  comm_ = make_communicator("auto");
  worker_ = std::make_unique<CommWorker>(*comm_, cfg_.comm_timeout);
  set_log_enabled(comm_->rank() == 0);
  if (comm_->size() > 1) check_ranks_agree();
  data_ = open_data(cfg_.data, cfg_.train_limit, cfg_.test_limit, cfg_.seed, cfg_.image_size);
  SPOTRAIN_CHECK(cfg_.batch_size <= data_.train->size(), "--batch-size ", cfg_.batch_size,
                 " is larger than the training set (", data_.train->size(), " samples)");
  BackendOptions bo;
  bo.threads = cfg_.threads;
  bo.deterministic = cfg_.deterministic;
  bo.tf32 = cfg_.precision == "tf32";  // fp32 storage, TF32 tensor-core math on GPUs
  backend_ = make_rank_backend(cfg_.device, bo, comm_, worker_, cfg_.comm_timeout);
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
  if (comm_->size() > 1) {
    // Every rank starts from rank 0's parameters and BN buffers.
    Tensor& flat = model_->flat_params();
    worker_->run("broadcast of the initial parameters",
                 [&] { comm_->broadcast(flat.raw(), flat.nbytes(), 0); });
    model_->parameters_changed();
    broadcast_buffers();
    ReducerOptions ro2;
    ro2.bucket_mb = cfg_.bucket_mb;
    ro2.compression = cfg_.grad_compression;
    reducer_ = std::make_unique<Reducer>(*model_, *worker_, ro2);
  }
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
  Reducer* red = reducer_.get();
  runner_ = std::make_unique<StepRunner>(
      *model_, *sgd_, *scaler_, prec, red,
      red ? std::function<double()>([red] { return red->finish(); }) : std::function<double()>(),
      comm_->size());
  if (prec == Precision::fp16 && backend_->device() == Device::cpu)
    log_info("note: fp16 on the CPU stores fp16 and computes in fp32 (slow; for checking loss "
             "scaling). bf16 is the fast CPU choice.");
  if (!cfg_.ckpt_dir.empty() && comm_->rank() == 0) {
    check_checkpoint_dir();
    writer_ = std::make_unique<AsyncCheckpointWriter>(cfg_.keep);
    // Snapshot buffers, touched now, so a checkpoint mid-training copies into warm pages
    // (faulting in a fresh ResNet-50-sized buffer costs ~0.5 s on a small machine); pinned
    // on a GPU, so a checkpoint's copy is one DMA that training does not wait for.
    Allocator& staging = backend_->host_staging_allocator();
    snap_params_ = Tensor({model_->num_params()}, DType::f32, staging);
    snap_momentum_ = Tensor({model_->num_params()}, DType::f32, staging);
    std::memset(snap_params_.raw(), 0, snap_params_.nbytes());
    std::memset(snap_momentum_.raw(), 0, snap_momentum_.nbytes());
    // The class index next to the checkpoints: line i names label i.
    std::vector<std::string> classes = data_.train->class_names();
    if (!classes.empty()) {
      std::ofstream cf(cfg_.ckpt_dir + "/classes.txt");
      for (auto& c : classes) cf << c << "\n";
      SPOTRAIN_CHECK(cf.good(), "cannot write ", cfg_.ckpt_dir, "/classes.txt");
    }
  }
  if (const char* f = std::getenv("SPOTRAIN_SAMPLE_LOG")) {  // test hook: sample ids per step
    std::string path = comm_->size() > 1 ? str(f, ".", comm_->rank()) : std::string(f);
    sample_log_ = std::fopen(path.c_str(), "a");
    SPOTRAIN_CHECK(sample_log_, "cannot write SPOTRAIN_SAMPLE_LOG file ", path);
  }
  if (!cfg_.metrics.empty() && comm_->rank() == 0) {
    metrics_ = std::fopen(cfg_.metrics.c_str(), "w");
    SPOTRAIN_CHECK(metrics_, "cannot write metrics file ", cfg_.metrics, ": ", std::strerror(errno));
    // A first line saying where the run ran: backend, ranks, GPU and CUDA library versions.
    nlohmann::json j{{"type", "start"}, {"backend", backend_->name()}, {"ranks", comm_->size()},
                     {"comm", comm_->name()}, {"precision", cfg_.precision}};
    for (auto& [k, v] : gpu_info_fields(gpu_info())) j["machine"][k] = v;
    std::fprintf(metrics_, "%s\n", j.dump().c_str());
    std::fflush(metrics_);
  }
}

Trainer::~Trainer() {
  if (metrics_) std::fclose(metrics_);
  if (sample_log_) std::fclose(sample_log_);
}

// Fail now, not after hours of training, when checkpoints cannot be written: the directory
// must be writable and hold a new checkpoint next to the previous one.
void Trainer::check_checkpoint_dir() {
  namespace fs = std::filesystem;
  const std::string& dir = cfg_.ckpt_dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::string probe = dir + "/.write-test";
  {
    std::ofstream f(probe);
    SPOTRAIN_CHECK(!ec && f.good(), "checkpoint directory ", dir,
                   " is not writable; pass a writable --ckpt-dir");
  }
  fs::remove(probe, ec);
  // Half-written files of a process killed mid-write: never valid, safe to remove.
  for (auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind("ckpt-", 0) == 0 && e.path().extension() == ".tmp") {
      log_info(str("removing the unfinished checkpoint ", e.path().string(),
                   " (a write was interrupted)"));
      fs::remove(e.path(), ec);
    }
  }
  int64_t need = checkpoint_bytes(*model_, true);
  std::error_code space_ec;
  int64_t free_bytes = int64_t(fs::space(dir, space_ec).available);
  if (const char* f = std::getenv("SPOTRAIN_FREE_BYTES")) {  // test hook
    free_bytes = std::atoll(f);
    space_ec.clear();
  }
  if (space_ec) return;  // space unknown (some network filesystems): the writes will tell
  auto mib = [](int64_t b) { return fmt_fixed(double(b) / double(1 << 20), 1) + " MiB"; };
  SPOTRAIN_CHECK(free_bytes >= 2 * need, "checkpoint directory ", dir, " has ", mib(free_bytes),
                 " free; writing a checkpoint of this model (", mib(need),
                 ") while keeping the previous one needs ", mib(2 * need),
                 "; free some space or pass another --ckpt-dir");
  int64_t keep_need = need * (cfg_.keep > 0 ? cfg_.keep + 1 : 4);
  if (free_bytes < keep_need)
    log_info(str("warning: checkpoint directory ", dir, " has ", mib(free_bytes), " free; --keep ",
                 cfg_.keep, " needs about ", mib(keep_need)));
}

EvalResult evaluate_model(Model& model, const io::Dataset& data, const std::string& data_kind,
                          int64_t batch_size, DType compute, CommWorker* worker, int workers,
                          double max_bad_fraction, const EvalBatchHook& on_batch) {
  io::LoaderOptions lo;
  lo.batch_size = batch_size;
  lo.train = false;
  lo.workers = std::max(1, workers);
  lo.max_bad_fraction = max_bad_fraction;
  lo.image_allocator = &model.backend().host_staging_allocator();  // pinned on CUDA
  if (data.encoded()) lo.image = image_transforms_for(data);
  if (worker) {
    lo.rank = worker->comm().rank();
    lo.world = worker->comm().size();
  }
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
    if (on_batch) on_batch(b, logits);
    int64_t n = int64_t(b.labels.size());
    loss_sum += l.loss * double(n);
    top1 += l.top1;
    top5 += l.top5;
    r.samples += n;
  }
  if (worker && worker->comm().size() > 1) {
    double sums[4] = {loss_sum, double(top1), double(top5), double(r.samples)};
    float f[4];
    // Counts are exact in fp32 up to 2^24 samples per rank; the loss sum is for display.
    for (int i = 0; i < 4; ++i) f[i] = float(sums[i]);
    worker->run("all-reduce of evaluation counts",
                [&] { worker->comm().allreduce_sum(f, 4, DType::f32); });
    loss_sum = f[0];
    top1 = int64_t(f[1]);
    top5 = int64_t(f[2]);
    r.samples = int64_t(f[3]);
  }
  if (r.samples > 0) {
    r.loss = loss_sum / double(r.samples);
    r.top1 = double(top1) / double(r.samples);
    r.top5 = double(top5) / double(r.samples);
  }
  return r;
}

void Trainer::broadcast_buffers() {
  if (comm_->size() == 1) return;
  for (auto* b : model_->buffers()) {
    Tensor& t = b->value;
    worker_->run("broadcast of " + b->name, [&] { comm_->broadcast(t.raw(), t.nbytes(), 0); });
  }
}

// Every rank must train the same thing: each setting of the run config, except those that
// may differ per node, is hashed and compared across ranks; a difference names the rank and
// the setting.
void Trainer::check_ranks_agree() {
  static const char* per_node[] = {"threads", "workers", "prefetch", "device", "comm_timeout",
                                   "metrics"};
  auto cfg = nlohmann::json::parse(cfg_.to_json());
  for (auto it = cfg.begin(); it != cfg.end(); ++it) {
    if (std::find(std::begin(per_node), std::end(per_node), it.key()) != std::end(per_node))
      continue;
    uint64_t h = uint64_t(std::hash<std::string>{}(it.value().dump()));
    std::vector<uint64_t> all;
    worker_->run("start-up check of " + it.key(), [&] { all = comm_->allgather(h); });
    std::string flag = "--" + it.key();
    std::replace(flag.begin(), flag.end(), '_', '-');
    for (size_t r = 1; r < all.size(); ++r)
      SPOTRAIN_CHECK(all[r] == all[0], "rank ", r, " was started with a different ", flag,
                     " than rank 0; every rank must get the same settings");
  }
}

std::string Trainer::write_checkpoint(int64_t step, int64_t epoch, int64_t batch_in_epoch,
                                      bool sync) {
  char name[32];
  std::snprintf(name, sizeof name, "ckpt-%08lld.h5", static_cast<long long>(step));
  std::string path = cfg_.ckpt_dir + "/" + name;
  if (writer_) {
    CheckpointInfo info;
    info.config_json = cfg_.to_json();
    info.model = cfg_.model;
    info.epoch = epoch;
    info.batch_in_epoch = batch_in_epoch;
    info.global_step = step;
    info.global_batch = cfg_.batch_size * comm_->size();
    info.world_size = comm_->size();
    info.samples_in_epoch = batch_in_epoch * info.global_batch;
    info.seed = cfg_.seed;
    info.num_classes = data_.train->num_classes();
    info.in_channels = data_.train->image_shape().c;
    info.precision = cfg_.precision;
    info.scaler = scaler_->state();
    if (writer_->busy()) {
      double t0 = now_seconds();
      poll_checkpoint_writer();
      writer_->wait();
      if (!sync)
        log_info(str("warning: the previous checkpoint write was still running; training waited ",
                     fmt_fixed(now_seconds() - t0, 2), " s (checkpoints are due faster than the disk "
                     "writes them: raise --ckpt-every)"));
    }
    poll_checkpoint_writer();
    double t0 = now_seconds();
    // Rank 0's BN statistics are saved (as every rank loads them on resume).
    writer_->submit(path, snapshot_checkpoint(*model_, sgd_.get(), info, &snap_params_,
                                              &snap_momentum_));
    writing_ = path;
    double snap = now_seconds() - t0;
    if (sync) {
      poll_checkpoint_writer();
      writer_->wait();
      log_info(str("checkpoint written: ", path, " in ",
                   fmt_fixed(snap + writer_->last_write_seconds(), 2), " s"));
      writing_.clear();
    } else {
      log_info(str("checkpoint ", path, ": training held ", fmt_fixed(snap, 3),
                   " s for the state copy, writing in the background"));
    }
  }
  if (sync && comm_->size() > 1)  // nobody exits before rank 0's file is safe
    worker_->run("barrier after the checkpoint", [&] { comm_->barrier(); });
  return path;
}

void Trainer::poll_checkpoint_writer() {
  if (!writer_ || writing_.empty() || writer_->busy()) return;
  std::string path = writing_;
  writing_.clear();
  try {
    writer_->check();
  } catch (const std::exception& e) {
    SPOTRAIN_THROW("checkpoint ", path, " could not be written: ", e.what(),
                   " (older checkpoints are intact)");
  }
  log_info(str("checkpoint written: ", path, " in ", fmt_fixed(writer_->last_write_seconds(), 2),
               " s (background)"));
}

Trainer::ResumePoint Trainer::resume() {
  ResumePoint rp;
  if (cfg_.resume == "none") return rp;
  // Header rank 0 broadcasts: status (0 none, 1 loaded, -1 failed), progress, scaler, SGD.
  int64_t h[12] = {0};
  std::string path, error;
  if (comm_->rank() == 0) {
    try {
      path = cfg_.resume == "auto" ? newest_good_checkpoint(cfg_.ckpt_dir) : cfg_.resume;
      if (!path.empty()) {
        CheckpointInfo ci = load_training_state(path, *model_, *sgd_);
        SPOTRAIN_CHECK(ci.model == cfg_.model, "checkpoint ", path, " is a ", ci.model,
                       " checkpoint; this run trains ", cfg_.model);
        int64_t world = ci.world_size > 0 ? ci.world_size : 1;
        int64_t global = ci.global_batch > 0 ? ci.global_batch : cfg_.batch_size * world;
        double scale = ci.scaler.scale;
        int64_t scale_bits;
        std::memcpy(&scale_bits, &scale, 8);
        int64_t vals[12] = {1, ci.global_step, ci.epoch, ci.batch_in_epoch, global, world,
                            sgd_->steps(), ci.scaler.good_steps, ci.scaler.skipped_steps,
                            ci.scaler.consecutive_overflows, scale_bits, 0};
        std::copy(vals, vals + 12, h);
      }
    } catch (const std::exception& e) {
      h[0] = -1;
      error = e.what();
    }
  }
  if (comm_->size() > 1)
    worker_->run("broadcast of the resume point", [&] { comm_->broadcast(h, sizeof h, 0); });
  if (h[0] < 0) {
    if (comm_->rank() == 0) throw Error(error);
    SPOTRAIN_THROW("rank 0 could not load the checkpoint to resume from (its error says why)");
  }
  if (h[0] == 0) {
    log_info(str("--resume ", cfg_.resume, ": no checkpoint in ", cfg_.ckpt_dir,
                 "; starting from scratch"));
    return rp;
  }
  int64_t global = h[4], world = comm_->size();
  SPOTRAIN_CHECK(global % world == 0, "the checkpoint was trained with a global batch of ", global,
                 " on ", h[5], " rank(s); it does not divide over ", world,
                 " ranks. Resume on a rank count that divides ", global);
  if (global / world != cfg_.batch_size) {
    log_info(str("resuming a ", h[5], "-rank checkpoint on ", world, " rank(s): per-rank batch ",
                 global / world, " keeps its global batch of ", global, " (--batch-size ",
                 cfg_.batch_size, " is overridden)"));
    cfg_.batch_size = global / world;
  }
  if (comm_->size() > 1) {  // every rank continues from rank 0's state
    Tensor& flat = model_->flat_params();
    Tensor& mom = sgd_->momentum();
    worker_->run("broadcast of the checkpoint's parameters",
                 [&] { comm_->broadcast(flat.raw(), flat.nbytes(), 0); });
    worker_->run("broadcast of the checkpoint's momentum",
                 [&] { comm_->broadcast(mom.raw(), mom.nbytes(), 0); });
    broadcast_buffers();
    model_->parameters_changed();
    sgd_->set_steps(h[6]);
  }
  LossScalerState st;
  std::memcpy(&st.scale, &h[10], 8);
  st.good_steps = h[7];
  st.skipped_steps = h[8];
  st.consecutive_overflows = h[9];
  scaler_->set_state(st);
  rp.step = h[1];
  rp.epoch = h[2];
  rp.batch_in_epoch = h[3];
  log_info(str("resumed from ", comm_->rank() == 0 ? path : std::string("rank 0's checkpoint"),
               ": step ", rp.step, ", epoch ", rp.epoch + 1, ", batch ", rp.batch_in_epoch));
  return rp;
}

EvalResult Trainer::evaluate(const io::Dataset& data, int64_t batch_size) {
  broadcast_buffers();  // rank 0's BN statistics, as DDP, so every rank evaluates one model
  return evaluate_model(*model_, data, data_.kind, batch_size, runner_->compute_dtype(),
                        worker_.get(), cfg_.workers, cfg_.max_bad_fraction);
}

TrainResult Trainer::run() {
  const ResumePoint rp = resume();  // may change the per-rank batch (elastic resume)
  io::LoaderOptions lo;
  lo.batch_size = cfg_.batch_size;
  lo.train = true;
  lo.seed = cfg_.seed;
  lo.workers = cfg_.workers;
  lo.prefetch = cfg_.prefetch;
  lo.image_allocator = &backend_->host_staging_allocator();  // pinned on CUDA
  lo.augment = cfg_.augment;
  lo.max_bad_fraction = cfg_.max_bad_fraction;
  if (data_.train->encoded()) lo.image = image_transforms_for(*data_.train);
  lo.rank = comm_->rank();
  lo.world = comm_->size();
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
  if (comm_->size() > 1)
    log_info(str("data parallel over ", comm_->size(), " ranks (", comm_->name(), "), global batch ",
                 cfg_.batch_size * comm_->size(), ", ", reducer_->num_buckets(),
                 " gradient buckets of up to ", cfg_.bucket_mb, " MB, compression ",
                 cfg_.grad_compression));
  if (backend_->device() == Device::cuda) log_info(gpu_info_line(gpu_info()));
  log_info(str("backend ", backend_->name(), "; data ", data_.kind, ": ", data_.train->size(),
               " train / ", data_.test->size(), " test samples; ", epochs, " epoch(s) of ",
               per_epoch, " steps, batch ", cfg_.batch_size));

  TrainResult res;
  int64_t step = rp.step, start_epoch = rp.epoch, first_batch = rp.batch_in_epoch;
  if (first_batch >= per_epoch) {
    ++start_epoch;
    first_batch = 0;
  }
  install_stop_handlers();
  double t_start = now_seconds();
  double wall_limit = cfg_.max_wall_time.empty() ? 0 : parse_duration(cfg_.max_wall_time);
  double last_ckpt_time = t_start, last_step_end = t_start, step_time = 0, snapshot_seconds = 0;
  bool stop_cost_logged = false;
  // Whether --max-wall-time leaves no room for two more steps and a checkpoint.
  auto wall_near = [&] {
    if (wall_limit <= 0) return false;
    double ckpt_seconds = writer_ ? snapshot_seconds + writer_->last_write_seconds() : 0.0;
    double margin = std::min(5.0, 0.05 * wall_limit);
    return now_seconds() - created_ + 2 * step_time + ckpt_seconds + margin > wall_limit;
  };
  int64_t step0 = step, cur_epoch = start_epoch, cur_batch = first_batch;
  for (int64_t epoch = start_epoch; epoch < epochs && step < total_steps; ++epoch) {
    loader.start_epoch(epoch, epoch == start_epoch ? first_batch : 0);
    io::Batch b;
    double win_loss = 0, ep_loss = 0;
    int64_t win_correct = 0, win_n = 0, ep_correct = 0, ep_n = 0;
    double win_t0 = now_seconds(), ep_t0 = win_t0;
    while (step < total_steps && loader.next(b)) {
      float lr = sched.at(step);
      worker_->set_step(step + 1);  // 1-based, as in the progress lines
      inject_fault(comm_->rank(), step + 1);
      if (sample_log_) {
        std::fprintf(sample_log_, "%lld", static_cast<long long>(step + 1));
        for (int64_t id : b.sample_ids) std::fprintf(sample_log_, " %lld", static_cast<long long>(id));
        std::fprintf(sample_log_, "\n");
        std::fflush(sample_log_);
      }
      // Stop requests seen before the step travel with its last gradient bucket, so all
      // ranks learn every rank's flag at no extra round trip and stop after the same step.
      std::string stop_reason = stop_requested() ? "a signal" : wall_near() ? "--max-wall-time" : "";
      if (reducer_) reducer_->set_control(0, stop_reason.empty() ? 0.f : 1.f);
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
        if (comm_->size() > 1) {  // the logged loss and accuracy are the global batch's
          float f[3] = {float(win_loss), float(win_correct), float(win_n)};
          worker_->run("all-reduce of the logged loss",
                       [&] { comm_->allreduce_sum(f, 3, DType::f32); });
          win_loss = f[0];
          win_correct = int64_t(f[1]);
          win_n = int64_t(f[2]);
        }
        double t = now_seconds();
        double ips = double(win_n) / std::max(1e-9, t - win_t0);
        double elapsed = t - t_start;
        double eta = elapsed / double(step - step0) * double(total_steps - step);
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
      cur_epoch = epoch;
      cur_batch = b.batch_index + 1;
      double step_end = now_seconds();
      step_time = step_end - last_step_end;  // the latest step, not the warm-up average
      last_step_end = step_end;
      // What a stop costs, once the first checkpoint has been written: the step under way,
      // then a synchronous write with fsync and verification. Launchers must allow that.
      if (!stop_cost_logged && writer_ && writer_->last_write_seconds() > 0) {
        stop_cost_logged = true;
        const double write = snapshot_seconds + writer_->last_write_seconds();
        log_info(str("a stop takes about ", fmt_fixed(step_time + write, 1), " s (the step under way ",
                     fmt_fixed(step_time, 1), " s + writing and verifying a checkpoint ",
                     fmt_fixed(write, 1), " s): give the job at least that much time between "
                     "the stop signal and a kill (docs/MULTI_NODE.md, 'Stopping it')"));
      }
      bool stop;
      if (reducer_) {
        stop = reducer_->control(0) > 0;
        if (stop && stop_reason.empty()) stop_reason = "a stop request on another rank";
      } else {
        if (stop_reason.empty() && stop_requested()) stop_reason = "a signal";
        stop = !stop_reason.empty();
      }
      if (stop && stop_reason == "--max-wall-time")
        log_info(str("--max-wall-time ", cfg_.max_wall_time, " is near: stopping"));
      if (stop && step < total_steps) {
        SPOTRAIN_CHECK(!cfg_.ckpt_dir.empty(), "stopped by ", stop_reason, " at step ", step,
                       " with no --ckpt-dir: nothing was saved");
        res.checkpoint = write_checkpoint(step, cur_epoch, cur_batch, /*sync=*/true);
        log_info(str("stopped by ", stop_reason, " after step ", step, "; resume with --resume auto"));
        res.stopped = true;
        res.steps = step;
        res.seconds = now_seconds() - t_start;
        return res;
      }
      poll_checkpoint_writer();
      // Periodic and epoch-end checkpoints: rank 0 alone decides and writes in the background.
      bool periodic = (cfg_.ckpt_every > 0 && step % cfg_.ckpt_every == 0) ||
                      (cfg_.ckpt_every_min > 0 &&
                       now_seconds() - last_ckpt_time >= cfg_.ckpt_every_min * 60);
      bool epoch_end = cur_batch == per_epoch;
      if ((periodic || epoch_end) && step < total_steps && writer_) {
        double t0 = now_seconds();
        res.checkpoint = write_checkpoint(step, cur_epoch, cur_batch, /*sync=*/false);
        snapshot_seconds = now_seconds() - t0;
        last_ckpt_time = now_seconds();
      }
    }
    double ep_secs = now_seconds() - ep_t0;
    if (comm_->size() > 1) {  // the epoch summary is the whole job's
      float f[3] = {float(ep_loss), float(ep_correct), float(ep_n)};
      worker_->run("all-reduce of the epoch summary", [&] { comm_->allreduce_sum(f, 3, DType::f32); });
      ep_loss = f[0];
      ep_correct = int64_t(f[1]);
      ep_n = int64_t(f[2]);
    }
    res.final_loss = ep_n ? ep_loss / double(ep_n) : 0;
    res.train_top1 = ep_n ? double(ep_correct) / double(ep_n) : 0;
    res.images_per_sec = double(ep_n) / std::max(1e-9, ep_secs);
    bool final_epoch = !(epoch + 1 < epochs && step < total_steps);
    const bool eval_due = cfg_.eval_each_epoch && cfg_.eval_every > 0 && (epoch + 1) % cfg_.eval_every == 0;
    if (eval_due || final_epoch) {
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
  auto bad = loader.bad_samples();
  if (!bad.empty()) {
    std::string list;
    for (size_t i = 0; i < bad.size() && i < 20; ++i) list += "\n  " + bad[i].what;
    std::fprintf(stderr, "warning: rank %d skipped %zu unreadable training image(s):%s%s\n",
                 comm_->rank(), bad.size(), list.c_str(), bad.size() > 20 ? "\n  ..." : "");
  }
  res.bad_images = int64_t(bad.size());
  res.steps = step;
  res.seconds = now_seconds() - t_start;
  res.skipped_steps = scaler_->state().skipped_steps;
  res.loss_scale = scaler_->scale();
  if (!cfg_.ckpt_dir.empty())
    res.checkpoint = write_checkpoint(step, cur_epoch, cur_batch, /*sync=*/true);
  return res;
}

}  // namespace spotrain
