// `spotrain bench`: training-step throughput on synthetic or real data (warm-up, then timed
// steps), per-phase breakdown with the data wait, per-rank and total images/s, peak memory,
// the machine, the cost of a 90-epoch ImageNet run; optional JSON output. The session, the
// training spec and the loader are built by the functions `train` uses (run/setup.h), from a
// RunConfig made of bench's options.
#include "tools/spotrain/commands.h"

#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include "core/atomic_file.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "core/philox.h"
#include "engine/data.h"
#include "engine/session.h"
#include "io/loader.h"
#include "kernels/device_info.h"
#include "kernels/op_profiler.h"
#include "kernels/step_capture.h"
#include "layers/resnet.h"
#include "observe/input_watch.h"
#include "observe/telemetry.h"
#include "run/setup.h"

namespace spotrain::cli {

namespace {

// bench's own options; the training settings it shares with train (model, batch, precision,
// device, data, ...) are train's, from the settings table, in `run` with bench's defaults.
struct BenchOptions {
  RunConfig run = bench_defaults();
  int channels = 3;
  int num_classes = 1000;
  int steps = 10;
  int warmup = 2;
  std::string json;
  double price_per_hour = 0;
  bool profile = false;  // time every op (device events on a GPU) and print where a step goes
  bool end_to_end = false;  // also time --steps steps queued back to back, waited for once

  static RunConfig bench_defaults() {
    RunConfig c;
    c.model = "resnet50";
    c.batch_size = 32;
    c.image_size = 224;
    c.data = "synthetic";  // synthetic | imagefolder:DIR | shards:DIR (training transforms)
    c.workers = 4;
    c.prefetch = 4;
    c.metrics = "none";
    c.ckpt_dir = "";
    return c;
  }
};

// The settings of the table bench takes (train's flags, help and choices).
const std::vector<std::string> kBenchSettings = {
    "--model",  "--batch-size", "--accum-steps", "--image-size", "--threads",  "--precision",        "--grad-checkpoint", "--fusion",
    "--device", "--data",       "--workers",    "--prefetch", "--max-bad-fraction", "--seed",            "--cuda-graph,!--no-cuda-graph",
    "--autotune,!--no-autotune", "--kernel-cache", "--optimizer", "--lars-trust", "--lars-epsilon"};

// The training settings bench's options stand for.
const RunConfig& run_config_of(const BenchOptions& o) { return o.run; }

// Images a step trains on each rank: every micro-batch's (--accum-steps).
int64_t step_images(const BenchOptions& o) { return o.run.batch_size * o.run.accum_steps; }

// --fusion auto's chains that run fused (null where nothing was chosen: none, bn, the CPU).
nlohmann::json fused_chains(const StepRunner& runner) {
  if (runner.fusion_verdicts().empty()) return nullptr;
  int n = 0;
  for (const FusionVerdict& v : runner.fusion_verdicts()) n += v.fused;
  return n;
}

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

// The timed steps' figures (seconds per step, one entry per timed step).
struct Timings {
  std::vector<double> step, forward, backward, optimizer, data, comm, captured;
  size_t activation_peak = 0;  // bytes a step needed beyond what was alive before it
  // The live bytes at the highest step's peak by what allocated them (AllocScope).
  std::vector<std::pair<std::string, size_t>> peak_by_scope;
  double median(const std::vector<double>& v) const { return percentile(v, 0.5); }
};

// What the timed steps train on: one synthetic batch uploaded once (it stays on the device in
// the compute dtype, as NVIDIA's reference scripts do), or the training loader over real data.
struct BenchInput {
  std::unique_ptr<io::Loader> loader;
  Tensor images, device_images;  // synthetic: the host batch and its upload
  std::vector<int32_t> labels;
  int num_classes = 0, channels = 0;
};

BenchInput make_input(const BenchOptions& o, const RunConfig& cfg, Session& session) {
  BenchInput in;
  in.num_classes = o.num_classes;
  in.channels = o.channels;
  if (o.run.data != "synthetic") {  // the training loader (decode + RandomResizedCrop + flip), this rank's slice
    DataPair dp = open_data(o.run.data, 0, 0, o.run.seed, o.run.image_size, /*with_test=*/false);
    SPOTRAIN_CHECK(dp.train->encoded(), "bench --data takes synthetic, imagefolder:DIR or shards:DIR");
    in.loader = std::make_unique<io::Loader>(dp.train, loader_options(cfg, first_split(session.world(), cfg.batch_size, cfg.accum_steps), dp, session));
    in.loader->start_epoch(0);
    in.num_classes = dp.train->num_classes();
    in.channels = 3;
    return in;
  }
  in.images = Tensor::host({o.run.batch_size, in.channels, o.run.image_size, o.run.image_size}, DType::f32, Layout::nhwc);
  Philox rng(o.run.seed, 0xBE7C);
  float* px = in.images.data<float>();
  for (int64_t i = 0; i < in.images.numel(); ++i) px[i] = rng.normal();
  in.labels.resize(size_t(o.run.batch_size));
  for (auto& l : in.labels) l = int32_t(rng.below(uint32_t(in.num_classes)));
  return in;
}

// The loader's next batch (the next epoch's first after the last), returning the seconds waited.
double next_batch(BenchInput& in, io::Batch& batch, int64_t& epoch) {
  const double t0 = now_seconds();
  if (!in.loader->next(batch)) {
    in.loader->start_epoch(++epoch);
    SPOTRAIN_CHECK(in.loader->next(batch), "bench: the data set yields no batch");
  }
  return now_seconds() - t0;
}

// Queues one micro-batch of a step (--accum-steps), the last of which run() or queue() takes.
void queue_micro_batch(BenchInput& in, const io::Batch& batch, StepRunner& runner, StepTimes* t) {
  if (in.loader)
    runner.queue(batch.images, batch.labels.data(), 0.01f, 0.f, t, nullptr, &batch.norm);
  else
    runner.queue_uploaded(in.device_images, in.labels.data(), 0.01f, 0.f, t);
}

// Warm-up, then the timed steps, each logged.
Timings time_steps(const BenchOptions& o, BenchInput& in, Session& session, StepRunner& runner,
                   Telemetry& telemetry) {
  Backend& be = session.backend();
  OpProfiler* prof = session.profiler();
  if (!in.loader) in.device_images = be.upload_images(in.images, runner.compute_dtype());
  Timings tm;
  int64_t epoch = 0;
  io::Batch batch;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    if (s == o.warmup) telemetry.sample();  // the rates reported cover the timed steps
    StepTimes t;
    const size_t before = be.allocator().stats().current_bytes;
    const size_t peak_before = be.allocator().stats().peak_bytes;
    be.allocator().reset_peak();
    double wait = 0;
    StepResult r;
    for (int j = 0; j < o.run.accum_steps; ++j) {  // the step's micro-batches (one by default)
      if (in.loader) wait += next_batch(in, batch, epoch);  // waiting for its batches is the data phase
      if (j + 1 < o.run.accum_steps) {
        queue_micro_batch(in, batch, runner, &t);
        continue;
      }
      r = in.loader ? runner.run(batch.images, batch.labels.data(), 0.01f, 0.f, &t, nullptr, &batch.norm)
                    : runner.run_uploaded(in.device_images, in.labels.data(), 0.01f, 0.f, &t);
    }
    t.data += wait;
    const auto after = be.allocator().stats();
    // What the step needed beyond what was alive before it: activations, their gradients
    // and temporaries (the resident weights, gradients and momentum excluded).
    if (after.peak_bytes - before >= tm.activation_peak) {
      tm.activation_peak = after.peak_bytes - before;
      tm.peak_by_scope = be.allocator().peak_by_scope();
    }
    if (peak_before > after.peak_bytes) be.allocator().restore_peak(peak_before);
    const double total = t.total();
    const bool timed = s >= o.warmup;
    if (prof) prof->collect(timed);
    log_info(str(timed ? "step " : "warm-up ", timed ? s - o.warmup + 1 : s + 1, ": ",
                 fmt_fixed(total, 3), " s, loss ", fmt_fixed(r.loss.loss, 4), ", ",
                 fmt_fixed(double(step_images(o) * session.world()) / total, 2), " img/s",
                 r.overflow ? " (overflow: step skipped)" : ""));
    if (!timed) continue;
    tm.step.push_back(total);
    tm.captured.push_back(t.captured);
    tm.data.push_back(t.data);
    tm.forward.push_back(t.forward);
    tm.backward.push_back(t.backward);
    tm.optimizer.push_back(t.optimizer);
    tm.comm.push_back(t.comm_exposed);
  }
  return tm;
}

// --end-to-end: --steps more steps queued as training queues them, with no wait between
// phases or steps (a GPU never waits for the host unless the host is slower), then one wait for
// the last: images/s as a run sees them, where the timed steps above synchronize their phases.
double time_end_to_end(const BenchOptions& o, BenchInput& in, Session& session, StepRunner& runner) {
  Backend& be = session.backend();
  io::Batch batch;
  int64_t epoch = 1000;  // the loader's epochs after the timed steps' (any not yet used)
  if (session.world() > 1)
    session.worker().run("the end-to-end timing's start", [&] { session.comm().barrier(); });
  const double t0 = now_seconds();
  for (int s = 0; s < o.steps; ++s)
    for (int j = 0; j < o.run.accum_steps; ++j) {  // each step's micro-batches
      if (in.loader) next_batch(in, batch, epoch);
      queue_micro_batch(in, batch, runner, nullptr);
    }
  runner.settle();
  be.synchronize();
  const double seconds = now_seconds() - t0;
  runner.take_results();
  return double(o.steps) * double(step_images(o) * session.world()) / seconds;
}

// Each rank's own rate (its batch over its median step), gathered from every rank.
std::vector<double> per_rank_rates(Session& session, int64_t batch, double median_step) {
  std::vector<double> rates(size_t(session.world()), double(batch) / median_step);
  if (session.world() == 1) return rates;
  uint64_t bits;
  std::memcpy(&bits, &rates[0], 8);
  std::vector<uint64_t> all;
  session.worker().run("gather of per-rank throughput", [&] { all = session.comm().allgather(bits); });
  for (size_t r = 0; r < rates.size(); ++r) std::memcpy(&rates[r], &all[r], 8);
  return rates;
}

// The timed steps' figures over all ranks, with the machine's.
struct Summary {
  double median = 0, p10 = 0, p90 = 0;  // images/s, all ranks
  std::vector<double> rank_ips;          // each rank's own
  double data = 0, step = 0;             // median seconds per step
  bool input_bound = false;
  AllocatorStats memory;                 // the device's tensors (a captured step's pool included)
  size_t captured_bytes = 0, rss = 0;
  std::string machine_cpu;
  nlohmann::json telemetry;
  double imagenet_seconds = 0;           // 90 epochs of ImageNet-1k at the median rate
};

Summary summarize(const BenchOptions& o, const Timings& tm, Session& session, Telemetry& telemetry) {
  Backend& be = session.backend();
  Summary s;
  s.telemetry = telemetry.sample();
  std::vector<double> ips;
  for (double t : tm.step) ips.push_back(double(step_images(o) * session.world()) / t);
  s.median = percentile(ips, 0.5);
  s.p10 = percentile(ips, 0.1);
  s.p90 = percentile(ips, 0.9);
  s.data = tm.median(tm.data);
  s.step = tm.median(tm.step);
  s.rank_ips = per_rank_rates(session, step_images(o), s.step);
  s.input_bound = InputWatch::input_bound(s.data / s.step, telemetry.sm_util());
  s.machine_cpu = str(cpu_model(), " (", std::thread::hardware_concurrency(), " threads)");
  s.memory = be.allocator().stats();
  // A captured step's tensors live in memory of its own, held for the graph. It is made after
  // the eager warm-up steps gave their cached blocks back, so the two never add up: the peak
  // is the eager steps' or what the eager pool holds now beside the graph's, the larger.
  // (Summed, the 12-04 H200 run reported 23.37 GiB for a captured step that held 13.10 GiB,
  // against 13.37 GiB reserved by eager steps.)
  s.captured_bytes = be.capture() ? be.capture()->reserved_bytes() : 0;
  s.memory.peak_bytes = std::max(s.memory.peak_bytes, s.memory.current_bytes + s.captured_bytes);
  s.memory.reserved_bytes += s.captured_bytes;
  s.rss = peak_rss_bytes();
  s.imagenet_seconds = 90.0 * 1281167.0 / s.median;
  return s;
}

void log_summary(const BenchOptions& o, const Timings& tm, const Summary& s, OpProfiler* prof,
                 const StepRunner& runner) {
  if (!runner.capture_failure().empty())
    log_info(str("captured steps: the step was NOT recorded (", runner.capture_failure(),
                 "): the figures below are of steps run as they came"));
  auto gib = [](double b) { return fmt_fixed(b / (1 << 30), 3); };
  std::string per_rank;
  for (size_t r = 0; r < s.rank_ips.size(); ++r)
    per_rank += str(r ? ", " : "", "rank ", r, " ", fmt_fixed(s.rank_ips[r], 2));
  log_info(str("images/s: median ", fmt_fixed(s.median, 2), "  p10 ", fmt_fixed(s.p10, 2), "  p90 ",
               fmt_fixed(s.p90, 2), "  (", o.steps, " timed steps)"));
  log_info(str("images/s per rank (median): ", per_rank, "; total ", fmt_fixed(s.median, 2)));
  log_info(str("phases (median s/step): data ", fmt_fixed(s.data, 4), "  forward ",
               fmt_fixed(tm.median(tm.forward), 4), "  backward ", fmt_fixed(tm.median(tm.backward), 4),
               "  comm_exposed ", fmt_fixed(tm.median(tm.comm), 4), "  optimizer ",
               fmt_fixed(tm.median(tm.optimizer), 4),
               runner.captured() ? str("  captured_step ", fmt_fixed(tm.median(tm.captured), 4),
                                  " (a replayed CUDA Graph has no phases)")
                            : std::string()));
  log_info(str("peak memory: ", gib(double(s.memory.peak_bytes)), " GiB in tensors (",
               gib(double(s.memory.reserved_bytes)), " GiB reserved), ", gib(double(s.rss)),
               " GiB process RSS; ", gib(double(tm.activation_peak)), " GiB of it for activations",
               s.captured_bytes ? str("; ", gib(double(s.captured_bytes)), " GiB held for the captured step")
                                : std::string()));
  std::string by;
  for (const auto& [what, bytes] : tm.peak_by_scope)
    if (bytes >= (size_t(1) << 20)) by += str(by.empty() ? "" : ", ", what, " ", gib(double(bytes)));
  if (!by.empty()) log_info(str("at the peak, GiB by what allocated it: ", by));
  log_info(str("machine: ", s.machine_cpu, "; ", gpu_info_line(gpu_info())));
  if (s.input_bound)
    log_info(str("input-bound: the step waits ", fmt_fixed(100 * s.data / s.step, 1),
                 "% of its time for data; add loader threads (--workers, now ", o.run.workers,
                 ") or read packed shards (spotrain data pack) from faster storage"));
  if (prof)
    for (const std::string& line : prof->report()) log_info(line);
  if (o.price_per_hour > 0)
    log_info(str("90-epoch ImageNet at this rate: ", fmt_duration(s.imagenet_seconds), ", about $",
                 fmt_fixed(s.imagenet_seconds / 3600.0 * o.price_per_hour, 2), " at $",
                 fmt_fixed(o.price_per_hour, 2), "/hour"));
}

nlohmann::json bench_json(const BenchOptions& o, const Timings& tm, const Summary& s, Session& session,
                          bool loader, const StepRunner& runner, double end_to_end) {
  const bool captured = runner.captured();
  nlohmann::json j{{"model", o.run.model},
                   {"batch_size", o.run.batch_size},
                   {"accum_steps", o.run.accum_steps},
                   {"image_size", o.run.image_size},
                   {"precision", o.run.precision},
                   {"data", o.run.data},
                   {"workers", loader ? o.run.workers : 0},
                   {"images_per_sec_per_rank", s.rank_ips},
                   {"input_bound", s.input_bound},
                   {"grad_checkpoint", o.run.grad_checkpoint},
                   {"fusion", o.run.fusion},
                   {"optimizer", o.run.optimizer},
                   {"fusion_chains_fused", fused_chains(runner)},
                   {"ranks", session.world()},
                   {"steps", o.steps},
                   {"images_per_sec", s.median},
                   {"images_per_sec_p10", s.p10},
                   {"images_per_sec_p90", s.p90},
                   {"peak_memory_bytes", s.memory.peak_bytes},
                   {"reserved_memory_bytes", s.memory.reserved_bytes},
                   {"captured_step_bytes", s.captured_bytes},
                   {"peak_rss_bytes", s.rss},
                   {"peak_activation_bytes", tm.activation_peak},
                   {"phases",
                    {{"data", s.data},
                     {"forward", tm.median(tm.forward)},
                     {"backward", tm.median(tm.backward)},
                     {"comm_exposed", tm.median(tm.comm)},
                     {"optimizer", tm.median(tm.optimizer)},
                     {"captured_step", tm.median(tm.captured)}}},
                   {"cuda_graph", captured},
                   {"images_per_sec_end_to_end", o.end_to_end ? nlohmann::json(end_to_end) : nlohmann::json(nullptr)},
                   {"machine", {{"cpu", s.machine_cpu}, {"backend", session.backend().name()}}}};
  for (auto& [k, v] : gpu_info_fields(gpu_info())) j["machine"][k] = v;
  j["peak_bytes_by_scope"] = nlohmann::json::object();
  for (const auto& [what, bytes] : tm.peak_by_scope) j["peak_bytes_by_scope"][what] = bytes;
  j["telemetry"] = s.telemetry;  // GPU (null without one) and host, over the timed steps
  if (OpProfiler* prof = session.profiler()) {
    for (const auto& r : prof->by_op())
      j["profile"]["ops"].push_back({{"op", r.name}, {"ms_per_step", r.ms_per_step},
                                     {"calls_per_step", r.calls_per_step}});
    for (const auto& r : prof->by_shape(40))
      j["profile"]["shapes"].push_back({{"op", r.name}, {"ms_per_step", r.ms_per_step},
                                        {"calls_per_step", r.calls_per_step}});
    j["profile"]["choices"] = session.backend().kernel_choices();
    for (const FusionVerdict& v : runner.fusion_verdicts())
      j["profile"]["fusion"].push_back({{"chain", v.chain}, {"fused", v.fused},
                                        {"fused_ms", v.fused_ms}, {"apart_ms", v.apart_ms}});
  }
  if (o.price_per_hour > 0)
    j["imagenet_90_epochs"] = {{"seconds", s.imagenet_seconds},
                               {"usd", s.imagenet_seconds / 3600.0 * o.price_per_hour},
                               {"price_per_hour", o.price_per_hour}};
  return j;
}

}  // namespace

// What --dry-run checks and a run checks first: the run's settings as train checks them, and
// bench's own.
static void check_bench(const BenchOptions& o) {
  o.run.validate();
  parse_precision(o.run.precision);
  SPOTRAIN_CHECK(o.steps > 0, "--steps must be positive");
  SPOTRAIN_CHECK(o.warmup >= 0, "--warmup must not be negative");
  SPOTRAIN_CHECK(o.run.image_size >= 8, "--image-size must be at least 8");
}

static int run_bench(BenchOptions o) {
  check_bench(o);
  RunConfig cfg = run_config_of(o);
  check_thread_counts(cfg.threads, cfg.workers);
  SessionOptions so = session_options(cfg);
  so.profile = o.profile;
  Session session(so);
  Backend& be = session.backend();
  BenchInput in = make_input(o, cfg, session);
  // The GPU and host while the timed steps run (sampled over them, as train does per window).
  Telemetry telemetry(be.gpu_pci_bus_id());
  const std::string device = be.device_line();
  if (!device.empty()) log_info(device);
  // --profile times the ops one by one, which a replayed step does not run.
  if (o.profile && cfg.cuda_graph && be.capture()) {
    log_info("--profile: steps run as they come, not captured (a replayed step's ops are not "
             "timed one by one)");
    cfg.cuda_graph = false;
  }
  Training tr = session.make_training(
      training_spec(cfg, first_split(session.world(), cfg.batch_size, cfg.accum_steps), session.rank(), in.num_classes,
                    in.channels));
  // Captured steps: the first steps run as they come and the next one records the step; none
  // of them is timed.
  if (tr.runner->capturing() && o.warmup <= StepRunner::kEagerBeforeCapture) {
    log_info(str("captured steps: ", StepRunner::kEagerBeforeCapture + 1,
                 " warm-up steps (the last records the step)"));
    o.warmup = StepRunner::kEagerBeforeCapture + 1;
  }
  log_info(str("bench ", o.run.model, " batch ", o.run.batch_size,
               o.run.accum_steps > 1 ? str(" x ", o.run.accum_steps, " micro-batches per step") : "",
               session.world() > 1 ? str(" per rank x ", session.world(), " ranks") : "", " ",
               o.run.image_size, "x", o.run.image_size, "x", in.channels, " ", o.run.precision, " on ", be.name(),
               "; data ", o.run.data, in.loader ? str(" (", o.run.workers, " loader threads)") : std::string(),
               "; ", tr.model->summary()));
  const Timings tm = time_steps(o, in, session, *tr.runner, telemetry);
  const Summary s = summarize(o, tm, session, telemetry);
  log_summary(o, tm, s, session.profiler(), *tr.runner);
  if (session.profiler()) {  // which kernels the backend settled on, per shape, and --fusion auto's verdicts
    for (const std::string& line : be.kernel_choices()) log_info("  chosen: " + line);
    for (const FusionVerdict& v : tr.runner->fusion_verdicts())
      log_info(str("  fusion: ", v.chain, v.fused ? " fused" : " apart", " (fused ",
                   fmt_fixed(v.fused_ms, 3), " ms, apart ", fmt_fixed(v.apart_ms, 3), " ms)"));
  }
  const double end_to_end = o.end_to_end ? time_end_to_end(o, in, session, *tr.runner) : 0.0;
  if (o.end_to_end)
    log_info(str("images/s end to end (", o.steps, " steps queued back to back, no wait between "
                 "phases): ", fmt_fixed(end_to_end, 2), " (", fmt_fixed(end_to_end / s.median, 3),
                 "x the median of the timed steps)"));
  if (!o.json.empty() && session.rank() == 0)
    write_file_atomic(o.json, bench_json(o, tm, s, session, in.loader != nullptr, *tr.runner, end_to_end).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                      "the --json file");
  return 0;
}

Command add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  BenchOptions& bo = *o;
  auto* bench = app.add_subcommand("bench", "measure training-step throughput (synthetic or real data)");
  add_run_settings(bench, bo.run, kBenchSettings);
  bench->add_option("--channels", bo.channels, "input channels")->capture_default_str();
  bench->add_option("--num-classes", bo.num_classes, "classes")->capture_default_str();
  bench->add_option("--steps", bo.steps, "timed steps")->capture_default_str();
  bench->add_option("--warmup", bo.warmup, "untimed warm-up steps")->capture_default_str();
  bench->add_option("--json", bo.json, "write the results as JSON to FILE");
  bench->add_option("--price-per-hour", bo.price_per_hour,
                    "USD per hour: estimate the cost of a 90-epoch ImageNet run");
  bench->add_flag("--profile", bo.profile,
                  "time every op (CUDA events on a GPU) and print where a step's time goes");
  bench->add_flag("--end-to-end", bo.end_to_end,
                  "then queue --steps more steps back to back and time them together (no wait "
                  "between phases or steps, as training runs)");
  auto check = [o] {
    check_bench(*o);
    std::printf("spotrain bench --dry-run: the command line is valid\n");
    return 0;
  };
  return {bench, [o] { return run_bench(*o); }, check};
}

}  // namespace spotrain::cli
