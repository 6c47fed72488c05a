// `spotrain bench`: training-step throughput on synthetic or real data (warm-up, then timed
// steps), per-phase breakdown with the data wait, per-rank and total images/s, peak memory,
// the machine, the cost of a 90-epoch ImageNet run; optional JSON output.
#include "tools/spotrain/commands.h"

#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <thread>
#include <fstream>
#include <functional>
#include <memory>
#include <vector>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "core/philox.h"
#include "engine/data.h"
#include "engine/session.h"
#include "observe/telemetry.h"
#include "io/loader.h"
#include "kernels/device_info.h"
#include "kernels/profiled_backend.h"

namespace spotrain::cli {

namespace {

struct BenchOptions {
  std::string model = "resnet50";
  int64_t batch_size = 32;
  int image_size = 224;
  int channels = 3;
  int num_classes = 1000;
  int steps = 10;
  int warmup = 2;
  int threads = 0;
  std::string precision = "fp32";
  std::string grad_checkpoint = "none";
  std::string device = "auto";
  std::string data = "synthetic";  // synthetic | imagefolder:DIR | shards:DIR (training transforms)
  int workers = 4;                  // loader threads for real data
  int prefetch = 4;                 // batches the loader prepares ahead
  double max_bad_fraction = 0.001;  // unreadable images tolerated (fraction of the set)
  std::string json;
  double price_per_hour = 0;
  uint64_t seed = 0;
  bool profile = false;  // time every op (device events on a GPU) and print where a step goes
  bool cuda_graph = false;  // steps replayed from one recorded as a CUDA Graph
};

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  double pos = q * double(v.size() - 1);
  size_t i = size_t(pos);
  double f = pos - double(i);
  return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}
std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}
size_t peak_rss_bytes() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return size_t(ru.ru_maxrss) * 1024;
}
}  // namespace

static int run_bench(BenchOptions o) {
  SPOTRAIN_CHECK(o.batch_size > 0, "--batch-size must be positive, got ", o.batch_size);
  SPOTRAIN_CHECK(o.steps > 0, "--steps must be positive");
  SPOTRAIN_CHECK(o.warmup >= 0, "--warmup must not be negative");
  SPOTRAIN_CHECK(!(o.cuda_graph && o.profile),
                 "--profile times the ops one by one, which a captured step does not run: drop "
                 "--profile or --cuda-graph");
  // With --cuda-graph the first steps run eagerly and the next one records the graph: none
  // of them is timed.
  if (o.cuda_graph && o.warmup <= StepRunner::kEagerBeforeCapture) {
    log_info(str("--cuda-graph: ", StepRunner::kEagerBeforeCapture + 1,
                 " warm-up steps (the last records the step)"));
    o.warmup = StepRunner::kEagerBeforeCapture + 1;
  }
  SPOTRAIN_CHECK(o.image_size >= 8, "--image-size must be at least 8");
  Precision prec = parse_precision(o.precision);
  SessionOptions so;
  so.device = o.device;
  so.backend.threads = o.threads;
  so.backend.tf32 = prec == Precision::tf32;  // GPU: TF32 tensor cores for fp32 convolutions and Linear
  so.profile = o.profile;
  Session session(so);
  Backend* be = &session.backend();
  ProfiledBackend* prof = session.profiler();
  const int world = session.world();
  // Real data: the training loader (decode + RandomResizedCrop + flip), this rank's slice.
  std::unique_ptr<io::Loader> loader;
  int num_classes = o.num_classes, channels = o.channels;
  if (o.data != "synthetic") {
    DataPair dp = open_data(o.data, 0, 0, o.seed, o.image_size, /*with_test=*/false);
    io::LoaderOptions lo;
    lo.batch_size = o.batch_size;
    lo.rank = session.rank();
    lo.world = world;
    lo.seed = o.seed;
    lo.workers = o.workers;
    lo.prefetch = o.prefetch;
    lo.image_allocator = &be->host_staging_allocator();  // pinned on CUDA: one async DMA
    lo.max_bad_fraction = o.max_bad_fraction;
    SPOTRAIN_CHECK(dp.train->encoded(), "bench --data takes synthetic, imagefolder:DIR or shards:DIR");
    lo.image = image_transforms_for(*dp.train);
    loader = std::make_unique<io::Loader>(dp.train, lo);
    loader->start_epoch(0);
    num_classes = dp.train->num_classes();
    channels = 3;
  }
  const GpuInfo& gpu = gpu_info();
  // The GPU and host while the timed steps run (sampled over them, as train does per window).
  Telemetry telemetry(be->device() == Device::cuda ? current_gpu_pci_bus_id() : "");
  if (be->device() == Device::cuda) log_info(gpu_info_line(gpu));
  TrainingSpec spec;
  spec.net.arch = o.model;
  spec.net.num_classes = num_classes;
  spec.net.in_channels = channels;
  spec.net.grad_checkpoint = o.grad_checkpoint;
  spec.cuda_graph = o.cuda_graph;
  spec.seed = o.seed;
  spec.precision = prec;
  Training tr = session.make_training(spec);
  Model& model = *tr.model;
  StepRunner& runner = *tr.runner;

  // Synthetic data: one batch generated once and uploaded once, so it stays on the device
  // in the compute dtype (as NVIDIA's reference scripts do); steps then move no input data.
  Tensor images = Tensor::host({o.batch_size, channels, o.image_size, o.image_size}, DType::f32,
                               Layout::nhwc);
  Philox rng(o.seed, 0xBE7C);
  float* px = images.data<float>();
  for (int64_t i = 0; i < images.numel(); ++i) px[i] = rng.normal();
  std::vector<int32_t> labels(o.batch_size);
  for (auto& l : labels) l = int32_t(rng.below(uint32_t(num_classes)));
  Tensor device_images;
  if (!loader) device_images = be->upload_images(images, runner.compute_dtype());
  int64_t epoch = 0;
  io::Batch batch;

  log_info(str("bench ", o.model, " batch ", o.batch_size, world > 1 ? str(" per rank x ", world, " ranks") : "", " ", o.image_size, "x", o.image_size,
               "x", channels, " ", o.precision, " on ", be->name(), "; data ", o.data,
               loader ? str(" (", o.workers, " loader threads)") : std::string(), "; ", model.summary()));
  std::vector<double> step_s, fwd_s, bwd_s, opt_s, data_s, comm_s, captured_s;
  size_t act_peak = 0;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    if (s == o.warmup) telemetry.sample();  // the rates below cover the timed steps
    StepTimes t;
    size_t before = be->allocator().stats().current_bytes;
    size_t peak_before = be->allocator().stats().peak_bytes;
    be->allocator().reset_peak();
    double wait = 0;
    const Tensor* x = &images;
    const int32_t* y = labels.data();
    if (loader) {  // the time the step waits for its batch is the data phase
      double t0 = now_seconds();
      if (!loader->next(batch)) {
        loader->start_epoch(++epoch);
        SPOTRAIN_CHECK(loader->next(batch), "bench: the data set yields no batch");
      }
      wait = now_seconds() - t0;
      x = &batch.images;
      y = batch.labels.data();
    }
    StepResult r = loader ? runner.run(*x, y, 0.01f, 0.f, &t)
                          : runner.run_uploaded(device_images, y, 0.01f, 0.f, &t);
    t.data += wait;
    auto after = be->allocator().stats();
    // What the step needed beyond what was alive before it: activations, their gradients
    // and temporaries (the resident weights, gradients and momentum excluded).
    act_peak = std::max(act_peak, after.peak_bytes - before);
    if (peak_before > after.peak_bytes) be->allocator().restore_peak(peak_before);
    double total = t.total();
    bool timed = s >= o.warmup;
    if (prof) prof->collect(timed);
    log_info(str(timed ? "step " : "warm-up ", timed ? s - o.warmup + 1 : s + 1, ": ",
                 fmt_fixed(total, 3), " s, loss ", fmt_fixed(r.loss.loss, 4), ", ",
                 fmt_fixed(double(o.batch_size * world) / total, 2), " img/s",
                 r.overflow ? " (overflow: step skipped)" : ""));
    if (!timed) continue;
    step_s.push_back(total);
    captured_s.push_back(t.captured);
    data_s.push_back(t.data);
    fwd_s.push_back(t.forward);
    bwd_s.push_back(t.backward);
    opt_s.push_back(t.optimizer);
    comm_s.push_back(t.comm_exposed);
  }
  const nlohmann::json tel = telemetry.sample();
  std::vector<double> ips;
  for (double t : step_s) ips.push_back(double(o.batch_size * world) / t);
  double med = percentile(ips, 0.5), p10 = percentile(ips, 0.1), p90 = percentile(ips, 0.9);
  // Each rank's own rate (its batch over its step time), gathered to print them all.
  std::vector<double> rank_ips(size_t(world), double(o.batch_size) / percentile(step_s, 0.5));
  if (world > 1) {
    uint64_t bits;
    std::memcpy(&bits, &rank_ips[0], 8);
    std::vector<uint64_t> all;
    session.worker().run("gather of per-rank throughput",
                         [&] { all = session.comm().allgather(bits); });
    for (int r = 0; r < world; ++r) std::memcpy(&rank_ips[size_t(r)], &all[size_t(r)], 8);
  }
  std::string per_rank;
  for (int r = 0; r < world; ++r) per_rank += str(r ? ", " : "", "rank ", r, " ", fmt_fixed(rank_ips[size_t(r)], 2));
  const double data_med = percentile(data_s, 0.5), step_med = percentile(step_s, 0.5);
  const bool input_bound = data_med > 0.1 * step_med;
  const std::string machine_cpu = str(cpu_model(), " (", std::thread::hardware_concurrency(), " threads)");
  auto st = be->allocator().stats();
  // A captured step's tensors live in memory of its own, held for the graph (not in `st`).
  const size_t captured_bytes = be->capture_reserved_bytes();
  st.peak_bytes += captured_bytes;
  st.reserved_bytes += captured_bytes;
  size_t rss = peak_rss_bytes();
  log_info(str("images/s: median ", fmt_fixed(med, 2), "  p10 ", fmt_fixed(p10, 2), "  p90 ",
               fmt_fixed(p90, 2), "  (", o.steps, " timed steps)"));
  log_info(str("images/s per rank (median): ", per_rank, "; total ", fmt_fixed(med, 2)));
  log_info(str("phases (median s/step): data ", fmt_fixed(percentile(data_s, 0.5), 4), "  forward ",
               fmt_fixed(percentile(fwd_s, 0.5), 4), "  backward ", fmt_fixed(percentile(bwd_s, 0.5), 4),
               "  comm_exposed ", fmt_fixed(percentile(comm_s, 0.5), 4), "  optimizer ",
               fmt_fixed(percentile(opt_s, 0.5), 4),
               o.cuda_graph ? str("  captured_step ", fmt_fixed(percentile(captured_s, 0.5), 4),
                                  " (a replayed CUDA Graph has no phases)")
                            : std::string()));
  log_info(str("peak memory: ", fmt_fixed(double(st.peak_bytes) / (1 << 30), 3),
               " GiB in tensors (", fmt_fixed(double(st.reserved_bytes) / (1 << 30), 3),
               " GiB reserved), ", fmt_fixed(double(rss) / (1 << 30), 3), " GiB process RSS; ",
               fmt_fixed(double(act_peak) / (1 << 30), 3), " GiB of it for activations",
               captured_bytes ? str("; ", fmt_fixed(double(captured_bytes) / (1 << 30), 3),
                                    " GiB held for the captured step")
                              : std::string()));
  log_info(str("machine: ", machine_cpu, "; ", gpu_info_line(gpu)));
  if (input_bound)
    log_info(str("input-bound: the step waits ", fmt_fixed(100 * data_med / step_med, 1),
                 "% of its time for data (over 10%); add loader threads (--workers, now ", o.workers,
                 ") or read packed shards (spotrain data pack) from faster storage"));
  if (prof)
    for (const std::string& line : prof->report()) log_info(line);
  if (o.price_per_hour > 0) {
    double secs = 90.0 * 1281167.0 / med;
    log_info(str("90-epoch ImageNet at this rate: ", fmt_duration(secs), ", about $",
                 fmt_fixed(secs / 3600.0 * o.price_per_hour, 2), " at $",
                 fmt_fixed(o.price_per_hour, 2), "/hour"));
  }
  if (!o.json.empty() && session.rank() == 0) {
    nlohmann::json j{{"model", o.model},
                     {"batch_size", o.batch_size},
                     {"image_size", o.image_size},
                     {"precision", o.precision},
                     {"data", o.data},
                     {"workers", loader ? o.workers : 0},
                     {"images_per_sec_per_rank", rank_ips},
                     {"input_bound", input_bound},
                     {"grad_checkpoint", o.grad_checkpoint},
                     {"ranks", world},
                     {"steps", o.steps},
                     {"images_per_sec", med},
                     {"images_per_sec_p10", p10},
                     {"images_per_sec_p90", p90},
                     {"peak_memory_bytes", st.peak_bytes},
                     {"peak_rss_bytes", rss},
                     {"peak_activation_bytes", act_peak},
                     {"phases",
                      {{"data", percentile(data_s, 0.5)},
                       {"forward", percentile(fwd_s, 0.5)},
                       {"backward", percentile(bwd_s, 0.5)},
                       {"comm_exposed", percentile(comm_s, 0.5)},
                       {"optimizer", percentile(opt_s, 0.5)},
                       {"captured_step", percentile(captured_s, 0.5)}}},
                     {"cuda_graph", runner.captured()},
                     {"machine", {{"cpu", machine_cpu}, {"backend", be->name()}}}};
    for (auto& [k, v] : gpu_info_fields(gpu)) j["machine"][k] = v;
    j["telemetry"] = tel;  // GPU ("none" without one) and host, over the timed steps
    if (prof) {
      for (const auto& r : prof->by_op())
        j["profile"]["ops"].push_back({{"op", r.name}, {"ms_per_step", r.ms_per_step},
                                       {"calls_per_step", r.calls_per_step}});
      for (const auto& r : prof->by_shape(40))
        j["profile"]["shapes"].push_back({{"op", r.name}, {"ms_per_step", r.ms_per_step},
                                          {"calls_per_step", r.calls_per_step}});
    }
    if (o.price_per_hour > 0) {
      const double secs = 90.0 * 1281167.0 / med;
      j["imagenet_90_epochs"] = {{"seconds", secs}, {"usd", secs / 3600.0 * o.price_per_hour},
                                 {"price_per_hour", o.price_per_hour}};
    }
    std::ofstream f(o.json);
    SPOTRAIN_CHECK(f.good(), "cannot write --json file ", o.json);
    f << j.dump(2) << "\n";
  }
  return 0;
}

Command add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  BenchOptions& bo = *o;
  auto* bench = app.add_subcommand("bench", "measure training-step throughput (synthetic or real data)");
  bench->add_option("--model", bo.model, "model")->capture_default_str();
  bench->add_option("--batch-size", bo.batch_size, "batch size per rank")->capture_default_str();
  bench->add_option("--image-size", bo.image_size, "square input size")->capture_default_str();
  bench->add_option("--channels", bo.channels, "input channels")->capture_default_str();
  bench->add_option("--num-classes", bo.num_classes, "classes")->capture_default_str();
  bench->add_option("--steps", bo.steps, "timed steps")->capture_default_str();
  bench->add_option("--warmup", bo.warmup, "untimed warm-up steps")->capture_default_str();
  bench->add_option("--threads", bo.threads, "compute threads (0 = all cores)");
  bench->add_option("--precision", bo.precision, "fp32|tf32|bf16|fp16")->capture_default_str();
  bench->add_option("--grad-checkpoint", bo.grad_checkpoint, "none|block|stage|every:K")
      ->capture_default_str();
  bench->add_option("--device", bo.device, "auto|cpu|cuda")->capture_default_str();
  bench->add_option("--data", bo.data,
                    "synthetic (one batch made once) | imagefolder:DIR | shards:DIR (the training loader)")
      ->capture_default_str();
  bench->add_option("--workers", bo.workers, "loader threads for real data")->capture_default_str();
  bench->add_option("--prefetch", bo.prefetch, "batches the loader prepares ahead")->capture_default_str();
  bench->add_option("--max-bad-fraction", bo.max_bad_fraction,
                    "stop when more than this fraction of images is unreadable")
      ->capture_default_str();
  bench->add_option("--json", bo.json, "write the results as JSON to FILE");
  bench->add_option("--price-per-hour", bo.price_per_hour,
                    "USD per hour: estimate the cost of a 90-epoch ImageNet run");
  bench->add_option("--seed", bo.seed, "random seed");
  bench->add_flag("--profile", bo.profile,
                  "time every op (CUDA events on a GPU) and print where a step's time goes");
  bench->add_flag("--cuda-graph", bo.cuda_graph,
                  "GPU, one rank: record a step as a CUDA Graph once, then replay it each step");
  return {bench, [o] { return run_bench(*o); }};
}

}  // namespace spotrain::cli
