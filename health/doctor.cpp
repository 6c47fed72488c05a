// run_doctor and its checks (see doctor.h).
#include "health/doctor.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "core/philox.h"
#include "core/environment.h"
#include "engine/checkpoint_state.h"
#include "engine/fast_paths.h"
#include "engine/session.h"
#include "engine/step.h"
#include "health/gpu_health.h"
#include "health/op_cases.h"
#include "kernels/device_info.h"
#include "run/config.h"
#include "run/setup.h"

namespace spotrain::health {

namespace fs = std::filesystem;

const char* verdict_name(Verdict v) {
  return v == Verdict::ok ? "ok" : v == Verdict::warn ? "warn" : "fail";
}

std::string DoctorCheck::line() const {
  std::string s = str(verdict_name(verdict), std::string(6 - std::strlen(verdict_name(verdict)), ' '),
                      name, ": ", figure);
  if (!limit.empty()) s += " (" + limit + ")";
  return s;
}

bool healthy(const std::vector<DoctorCheck>& checks) {
  for (const DoctorCheck& c : checks)
    if (c.verdict == Verdict::fail) return false;
  return true;
}

// ---- the figures held against (docs/PERFORMANCE.md, "The node check") --------------------------

// 2026-12-06, the project's 2-core Intel Xeon machine (AVX-512, AVX-512 BF16, oneDNN 2.6.3):
// 160-168 GFLOP/s a core in the 1x1 convolution below; no AVX2-only machine was measured.
double Reference::cpu_gemm_gflops_per_core(bool avx512) { return avx512 ? 160.0 : 0.0; }
// The same machine, ResNet-50 batch 16 on 2 threads: 9.07-9.10 images/s at fp32 against
// 321-332 GFLOP/s, 0.67-0.70 of the GEMM rate; bf16 ran 6.90-7.05 images/s there (0.77x fp32;
// the EPYC machines of docs/PERFORMANCE.md ran it at 1.4-1.8x).
double Reference::cpu_resnet50_gemm_share() { return 0.67; }
double Reference::gpu_resnet50_images_per_sec(const std::string& gpu, const std::string& precision) {
  // One H200, 2026-12-04, captured steps (README, docs/PERFORMANCE.md).
  if (gpu.find("H200") != std::string::npos) {
    if (precision == "fp16") return 7478;
    if (precision == "bf16") return 7035;
    if (precision == "tf32") return 3632;
  }
  return 0;
}

namespace {

constexpr double kResNet50TrainGflopPerImage = 24.6;  // 3 x 4.1 GMAC forward, 2 FLOP a MAC
// Shares of the expected rate. A node at a third of it warns and passes (exit 0): with shares of
// the global batch that follow the ranks' rates it trains at its own speed, not the fleet's.
constexpr double kWarnBelow = 0.7, kFailBelow = 0.25;

bool cpu_has(const char* flag) {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("flags", 0) == 0) return (" " + line + " ").find(str(" ", flag, " ")) != std::string::npos;
  return false;
}

std::string gib(double b) { return fmt_fixed(b / double(1ull << 30), 2) + " GiB"; }
std::string mib(double b) { return fmt_fixed(b / double(1ull << 20), 1) + " MiB"; }

Verdict rate_verdict(double got, double want) {
  if (want <= 0) return Verdict::ok;
  return got < kFailBelow * want ? Verdict::fail : got < kWarnBelow * want ? Verdict::warn : Verdict::ok;
}

class Run {
 public:
  Run(const DoctorOptions& o, const std::function<void(const DoctorCheck&)>& out) : o_(o), out_(out) {}

  void add(std::string name, Verdict v, std::string figure, std::string limit = "") {
    DoctorCheck c{std::move(name), v, std::move(figure), std::move(limit)};
    if (out_) out_(c);
    checks_.push_back(std::move(c));
  }
  // Runs one check; an Error inside it is that check's failure.
  void guarded(const std::string& name, const std::function<void()>& f) {
    try {
      f();
    } catch (const std::exception& e) {
      add(name, Verdict::fail, e.what());
    }
  }
  std::vector<DoctorCheck>& checks() { return checks_; }
  const DoctorOptions& o() const { return o_; }

 private:
  const DoctorOptions& o_;
  const std::function<void(const DoctorCheck&)>& out_;
  std::vector<DoctorCheck> checks_;
};

std::string precision_of(const OpTarget& t) {
  if (t.tf32) return "tf32";
  return t.dt == DType::bf16 ? "bf16" : t.dt == DType::f16 ? "fp16" : "fp32";
}

// Every op of the backend against the float64 reference on the op suite's cases, per target
// (the CPU's blocked fp32 path, the one CPU training takes, among them). Targets that differ
// only in dtype share one backend, and a GPU's takes cuDNN's heuristics' kernels (no timing
// search): the doctor builds two CUDA backends, not four, and times nothing here.
void check_ops(Run& r, const std::string& device, int threads) {
  const std::vector<OpTarget>& targets = device == "cuda" ? cuda_op_targets() : cpu_op_targets();
  std::unique_ptr<Backend> ref = make_op_reference();
  std::unique_ptr<Backend> be;
  const OpTarget* made_for = nullptr;  // the target `be` was made for
  for (const OpTarget& t : targets) {
    if (!r.o().precision.empty() && precision_of(t) != r.o().precision) continue;
    const std::string name = str("ops ", device, " ", t.name);
    r.guarded(name, [&] {
      if (!be || !same_op_backend(*made_for, t)) {
        be.reset();
        be = make_op_backend(t, threads, /*autotune=*/false);
        made_for = &t;
      }
      const double t0 = now_seconds();
      const std::vector<OpCheck> checks = run_op_cases(*be, *ref, t);
      int failed = 0;
      double worst = 0;  // the largest err / limit
      for (const OpCheck& c : checks) {
        if (c.limit > 0) worst = std::max(worst, c.err / c.limit);
        if (c.passed()) continue;
        if (++failed > 5) continue;
        std::string l = c.line();  // "fail  op ...": the verdict is the doctor's own
        if (l.rfind("fail", 0) == 0) l = l.substr(std::min(l.size(), l.find_first_not_of(' ', 4)));
        r.add(name, Verdict::fail, l);
      }
      if (failed > 5) r.add(name, Verdict::fail, str(failed - 5, " more checks failed"));
      if (failed == 0)
        r.add(name, Verdict::ok,
              str(checks.size(), " checks against the float64 reference in ", fmt_fixed(now_seconds() - t0, 1),
                  " s, the worst at ", fmt_fixed(100 * worst, 1), "% of its tolerance"));
    });
  }
}

// The CPU's fp32 GEMM rate, as the training step meets it: a 1x1 convolution (oneDNN's GEMM
// kernels, in the backend's own activation layout: ResNet-50's most common op) against the
// figure measured on this project's reference machine kind. Returns GFLOP/s (0 on failure).
double check_gemm(Run& r, int threads) {
  double rate = 0;
  r.guarded("cpu gemm fp32", [&] {
    BackendOptions bo;
    bo.threads = threads;
    std::unique_ptr<Backend> be = make_backend("cpu", bo);
    const int64_t n = 16, c = 256, k = 256, hw = 28;
    Tensor hx = Tensor::host({n, c, hw, hw}, DType::f32, Layout::nhwc), hw_ = Tensor::host({k, c, 1, 1});
    Philox rng(7, 1);
    for (Tensor* t : {&hx, &hw_})
      for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = rng.normal();
    Tensor x = be->upload_activation(hx, DType::f32), w = be->from_host(hw_);
    const ConvParams p{1, 1, 1, 0};
    be->conv2d_forward(x, w, p);  // warm-up (primitive creation, the weights' reorder)
    double best = 1e30;
    for (int round = 0; round < 3; ++round) {  // the best of three rounds of 0.3 s
      int reps = 0;
      const double t0 = now_seconds();
      do {
        be->conv2d_forward(x, w, p);
        ++reps;
      } while (now_seconds() - t0 < 0.3);
      best = std::min(best, (now_seconds() - t0) / reps);
    }
    rate = 2.0 * double(n * hw * hw) * double(c * k) / best / 1e9;
    const int cores = threads > 0 ? threads : int(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
    const bool avx512 = cpu_has("avx512f");
    const double want = Reference::cpu_gemm_gflops_per_core(avx512) * cores;
    r.add("cpu gemm fp32", want > 0 ? rate_verdict(rate, want) : Verdict::ok,
          str(fmt_fixed(rate, 1), " GFLOP/s on ", cores, " threads in a 1x1 convolution (",
              fmt_fixed(rate / cores, 1), " a core, ", avx512 ? "AVX-512" : "AVX2",
              cpu_has("avx512_bf16") ? " with BF16" : "", ")"),
          want > 0 ? str("measured ", fmt_fixed(want / cores, 0),
                         " a core on this project's reference machine; warn below ",
                         int(kWarnBelow * 100), "%, fail below ", int(kFailBelow * 100), "%")
                   : "no figure measured on an AVX2-only processor: no verdict");
  });
  return rate;
}

size_t peak_rss_bytes() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return size_t(ru.ru_maxrss) * 1024;
}

int64_t host_memory_bytes() {
  return int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
}

// The first-use checks the steps ran (engine/fast_paths.h), one line each: passed, failed, or
// why a path was not checked here.
void report_fast_paths(Run& r, const std::string& device, FastPathChecks& checks, bool captures) {
  auto line = [&](const char* path, const std::string& unchecked) {
    const std::string v = checks.verdict(path);
    const std::string name = str("fast path ", path);
    if (v.rfind("passed: ", 0) == 0) r.add(name, Verdict::ok, "first-use check passed: " + v.substr(8));
    else if (v.rfind("failed: ", 0) == 0) r.add(name, Verdict::fail, "first-use check failed: " + v.substr(8));
    else r.add(name, unchecked.empty() ? Verdict::warn : Verdict::ok,
               unchecked.empty() ? "its first-use check did not run" : unchecked);
  };
  line(kFastPathPixels, "");
  if (captures) line(kFastPathCapture, "");
  else r.add(str("fast path ", kFastPathCapture), Verdict::ok, str("not used on ", device, ": steps run as they come"));
  line(kFastPathFusion, "not timed here (the doctor's steps run --fusion none, no timing search); the fused "
                        "ops themselves are the op suite's cases above");
}

// A few training steps, without timing searches (cuDNN's heuristics' kernels, --fusion none;
// captured steps as training has them): images/s against the rate expected for this device,
// peak memory against the device's, and the first-use checks of the fast paths the steps ran
// (the first step takes its batch as 8-bit pixels). `under_load` is called while the timed
// steps run on a GPU (queued, not yet waited for). Returns the checkpoint size of the model
// (bytes).
int64_t check_steps(Run& r, const std::string& device, double gemm_rate, const std::function<void()>& under_load) {
  const DoctorOptions& o = r.o();
  RunConfig cfg;
  cfg.model = o.model;
  cfg.device = device;
  cfg.threads = o.threads;
  cfg.autotune = false;  // bounded by design: no kernel timing search ...
  cfg.fusion = "none";   // ... and no --fusion auto timing (no kernel cache either: setup.cpp)
  if (!o.precision.empty()) cfg.precision = o.precision;
  else cfg.precision = device == "cuda" ? "fp16" : "fp32";
  const bool small = o.model.rfind("resnet", 0) == 0 && o.model != "resnet18" && o.model != "resnet34" &&
                     o.model != "resnet50" && o.model != "resnet101" && o.model != "resnet152";
  cfg.image_size = o.image_size > 0 ? o.image_size : small ? 28 : 224;
  cfg.batch_size = o.batch_size > 0 ? o.batch_size : device == "cuda" ? 256 : 16;
  const std::string name = str("steps ", cfg.model, " ", cfg.precision, " batch ", cfg.batch_size);
  int64_t ckpt = 0;
  r.guarded(name, [&] {
    SessionOptions so = session_options(cfg);
    so.comm = "local";
    Session session(so);
    const int classes = small ? 10 : 1000, channels = small ? 1 : 3;
    TrainingSpec spec = training_spec(cfg, first_split(1, cfg.batch_size, cfg.accum_steps), 0, classes, channels);
    spec.fast_path_file = "";  // a node check checks afresh: no run folder's kept verdicts
    Training t = session.make_training(spec);
    ckpt = checkpoint_bytes(*t.model, true);
    Backend& be = session.backend();
    // One batch of 8-bit pixels with ImageNet's normalization, and the same normalized floats.
    Tensor pixels = Tensor::host({cfg.batch_size, channels, cfg.image_size, cfg.image_size}, DType::u8,
                                 Layout::nhwc);
    Philox rng(cfg.seed, 0xD0C);
    uint8_t* px = static_cast<uint8_t*>(pixels.write_raw());
    for (int64_t i = 0; i < pixels.numel(); ++i) px[i] = uint8_t(rng.below(256));
    PixelNorm norm;
    const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
    for (int k = 0; k < 3; ++k) {
      norm.mean[k] = mean[k];
      norm.std[k] = sd[k];
    }
    std::vector<int32_t> labels(size_t(cfg.batch_size));
    for (auto& l : labels) l = int32_t(rng.below(uint32_t(classes)));
    Tensor x = be.upload_images(normalize_pixels_on_host(pixels, norm), t.runner->compute_dtype());
    // Warm-up: the first step chooses kernels and checks the 8-bit upload (a GPU's captured
    // steps record after two, checked against an eager step).
    const int warm = device == "cuda" ? StepRunner::kEagerBeforeCapture + 1 : 1;
    t.runner->run(pixels, labels.data(), 0.01f, 0.f, nullptr, nullptr, &norm);
    for (int s = 1; s < warm; ++s) t.runner->run_uploaded(x, labels.data(), 0.01f, 0.f);
    be.synchronize();
    const double t0 = now_seconds();
    for (int s = 0; s < o.steps; ++s) t.runner->queue_uploaded(x, labels.data(), 0.01f, 0.f);
    if (under_load) under_load();  // a GPU still runs the steps queued last
    t.runner->settle();
    const std::vector<StepResult> done = t.runner->take_results();
    be.synchronize();
    const double rate = double(cfg.batch_size) * o.steps / (now_seconds() - t0);
    const double loss = done.empty() ? std::nan("") : done.back().loss.loss;
    SPOTRAIN_CHECK(std::isfinite(loss), "the loss after ", warm + o.steps, " steps is ", loss);
    double want = 0;
    std::string basis;
    if (cfg.model == "resnet50" && device == "cpu" && gemm_rate > 0) {
      want = gemm_rate * Reference::cpu_resnet50_gemm_share() / kResNet50TrainGflopPerImage;
      if (cfg.precision == "bf16") want *= 0.75;  // the slowest bf16 measured against fp32
      if (cfg.precision != "fp32" && cfg.precision != "bf16") want = 0;  // fp16 computes in fp32: no figure
      basis = str("expected ", fmt_fixed(want, 1), " from this CPU's GEMM rate (",
                  int(Reference::cpu_resnet50_gemm_share() * 100), "% of it, as measured)");
    } else if (cfg.model == "resnet50" && device == "cuda" && cfg.batch_size == 256) {
      want = Reference::gpu_resnet50_images_per_sec(gpu_info().name, cfg.precision);
      basis = want > 0 ? str("expected ", fmt_fixed(want, 0), " as measured on an ", gpu_info().name)
                       : str("no figure measured for ", gpu_info().name, " at ", cfg.precision);
    } else {
      basis = "no figure measured for this model and batch";
    }
    r.add(name + " speed", rate_verdict(rate, want),
          str(fmt_fixed(rate, rate < 100 ? 2 : 0), " images/s over ", o.steps, " steps, loss ",
              fmt_fixed(loss, 3)),
          want > 0 ? str(basis, "; warn below ", int(kWarnBelow * 100), "% (a slower node still trains, at a smaller ",
                         "share of the global batch: --straggler-action rebalance), fail below ",
                         int(kFailBelow * 100), "%")
                   : basis);
    // Memory: the device's own allocator peak (GPU) or the process's peak RSS (CPU).
    const double peak = device == "cuda" ? double(be.allocator().stats().peak_bytes) : double(peak_rss_bytes());
    const double have = device == "cuda" ? double(gpu_info().memory_bytes) : double(host_memory_bytes());
    const double share = have > 0 ? peak / have : 0;
    r.add(name + " memory", share > 0.95 ? Verdict::fail : share > 0.85 ? Verdict::warn : Verdict::ok,
          str(gib(peak), device == "cuda" ? " peak on the GPU" : " peak resident", " of ", gib(have)),
          "warn above 85%, fail above 95%");
    report_fast_paths(r, device, t.runner->fast_path_checks(), be.capture() != nullptr);
  });
  return ckpt;
}

// The checkpoint folder: room for --keep checkpoints of the model (and one being written),
// and the time to write and fsync one, against the notice a spot reclaim gives.
void check_ckpt_dir(Run& r, int64_t ckpt_bytes) {
  const DoctorOptions& o = r.o();
  const std::string dir = o.ckpt_dir;
  r.guarded("ckpt-dir " + dir, [&] {
    std::error_code ec;
    fs::create_directories(dir, ec);
    SPOTRAIN_CHECK(!ec && fs::is_directory(dir), "cannot make the folder: ", ec.message());
    const int64_t need = ckpt_bytes * (o.keep > 0 ? o.keep + 1 : 2);
    int64_t free_bytes = int64_t(fs::space(dir, ec).available);
    if (test_hooks().free_bytes >= 0) free_bytes = test_hooks().free_bytes;
    r.add("ckpt-dir space", free_bytes < need ? Verdict::fail : free_bytes < 2 * need ? Verdict::warn : Verdict::ok,
          str(mib(double(free_bytes)), " free in ", dir),
          str("--keep ", o.keep, " checkpoints of ", o.model, " (", mib(double(ckpt_bytes)),
              " each) and one being written need ", mib(double(need))));
    // One checkpoint's bytes written and fsynced (at most 1 GiB of them), then removed.
    const int64_t bytes = std::min<int64_t>(ckpt_bytes, int64_t(1) << 30);
    const std::string path = (fs::path(dir) / str(".doctor-", host_name(), "-", getpid(), ".tmp")).string();
    std::vector<char> block(size_t(8) << 20, '\x5a');
    const double t0 = now_seconds();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    SPOTRAIN_CHECK(fd >= 0, "cannot write into the folder: ", std::strerror(errno));
    std::string problem;
    for (int64_t left = bytes; left > 0 && problem.empty();) {
      const size_t n = size_t(std::min<int64_t>(left, int64_t(block.size())));
      const ssize_t w = ::write(fd, block.data(), n);
      if (w < 0) problem = str("writing failed after ", mib(double(bytes - left)), ": ", std::strerror(errno));
      else left -= w;
    }
    if (problem.empty() && ::fsync(fd) != 0) problem = str("fsync failed: ", std::strerror(errno));
    ::close(fd);
    const double secs = now_seconds() - t0;
    fs::remove(path, ec);
    SPOTRAIN_CHECK(problem.empty(), problem);
    const double rate = double(bytes) / std::max(secs, 1e-6);
    const double ckpt_secs = double(ckpt_bytes) / rate;
    r.add("ckpt-dir write", ckpt_secs > 120 ? Verdict::fail : ckpt_secs > 30 ? Verdict::warn : Verdict::ok,
          str(fmt_fixed(rate / double(1 << 20), 0), " MiB/s written and fsynced: a checkpoint in ",
              fmt_fixed(ckpt_secs, 1), " s"),
          "warn above 30 s (a 30-second spot notice), fail above 120 s (a two-minute one)");
  });
}

}  // namespace

std::vector<DoctorCheck> run_doctor(const DoctorOptions& opt,
                                    const std::function<void(const DoctorCheck&)>& out) {
  SPOTRAIN_CHECK(opt.device == "auto" || opt.device == "cpu" || opt.device == "cuda",
                 "unknown --device '", opt.device, "'; use auto, cpu or cuda");
  SPOTRAIN_CHECK(opt.precision.empty() || opt.precision == "fp32" || opt.precision == "tf32" ||
                     opt.precision == "bf16" || opt.precision == "fp16",
                 "unknown --precision '", opt.precision, "'; use fp32, tf32, bf16 or fp16");
  SPOTRAIN_CHECK(opt.steps >= 1 && opt.steps <= 1000, "--steps must be 1 to 1000, not ", opt.steps);
  SPOTRAIN_CHECK(opt.keep >= 0, "--keep must be 0 or more, not ", opt.keep);
  const bool gpu = opt.device == "cuda" || (opt.device == "auto" && cuda_backend_ready());
  SPOTRAIN_CHECK(!(opt.device == "cuda" && !cuda_backend_ready()),
                 "--device cuda: no usable CUDA device (", gpu_info().status, ")");
  const std::string device = gpu ? "cuda" : "cpu";
  Run r(opt, out);
  r.add("device", Verdict::ok,
        gpu ? gpu_info_line(gpu_info())
            : str("CPU, ", opt.threads > 0 ? opt.threads : int(sysconf(_SC_NPROCESSORS_ONLN)),
                  " threads, ", cpu_has("avx512f") ? "AVX-512" : "AVX2",
                  cpu_has("avx512_bf16") ? " with BF16" : ""));
  check_ops(r, device, opt.threads);
  const double gemm = device == "cpu" ? check_gemm(r, opt.threads) : 0;
  if (gpu) check_gpu_health(gpu_info().pci_bus_id, [&r](const std::string& name, int v, const std::string& figure,
                                                        const std::string& limit) {
    r.add(name, Verdict(v), figure, limit);
  });
  // NVML's clocks and link are read while the steps run (an idle GPU lowers both on purpose).
  std::function<void()> under_load;
  if (gpu)
    under_load = [&r] {
      check_gpu_health_under_load(gpu_info().pci_bus_id, [&r](const std::string& name, int v,
                                                              const std::string& figure, const std::string& limit) {
        r.add(name, Verdict(v), figure + " (read while the steps ran)", limit);
      });
    };
  const int64_t ckpt = check_steps(r, device, gemm, under_load);
  if (!opt.ckpt_dir.empty()) check_ckpt_dir(r, ckpt > 0 ? ckpt : int64_t(200) << 20);
  return r.checks();
}

}  // namespace spotrain::health
