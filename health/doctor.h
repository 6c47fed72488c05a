// `spotrain doctor`: whether this node computes right and at its expected speed before a run
// pays for it, in one short pass: every op of the backend against the float64 reference on the
// op suite's cases (the CPU's blocked fp32 path a target of its own), a few training steps
// against the rate expected for this device with the first-use verdicts of the fast paths they
// ran, the GPU's own health through NVML (clocks and link read while the steps run), the
// checkpoint folder's room and write rate, and the CPU's GEMM rate. Bounded by design (a minute
// on a GPU node): nothing searches by timing (no kernel autotuning, --fusion none) and
// backends that differ only in dtype are built once. Each check is one line, ok, warn or fail,
// with its figure and limit.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace spotrain::health {

enum class Verdict { ok, warn, fail };
const char* verdict_name(Verdict v);  // "ok", "warn", "fail"

struct DoctorCheck {
  std::string name;    // "ops cpu nhwc_fp32", "steps resnet50 fp32", "ckpt-dir space", ...
  Verdict verdict = Verdict::ok;
  std::string figure;  // what was measured, in words and units
  std::string limit;   // what it was held against ("" where nothing is)
  // "fail  ckpt-dir space: 10.0 MiB free (needs 392.1 MiB for --keep 3 ...)"
  std::string line() const;
};

struct DoctorOptions {
  std::string device = "auto";    // auto | cpu | cuda
  std::string precision = "";     // one precision, or "" for each the device runs
  std::string ckpt_dir = "";      // "" skips the checkpoint folder's checks
  int keep = 3;                   // checkpoints kept (--keep)
  std::string model = "resnet50";
  int batch_size = 0;             // 0: 16 on a CPU, 256 on a GPU
  int steps = 2;                  // timed training steps (after one warm-up step)
  int threads = 0;                // CPU threads (0: every core)
  int image_size = 0;             // 0: the model's (224, or 28 for resnet20)
};

// Runs every check, handing each line to `out` as it is made; returns them all. Never throws
// for a failed check (an Error inside a check is that check's failure); throws Error only for
// bad options.
std::vector<DoctorCheck> run_doctor(const DoctorOptions& opt,
                                    const std::function<void(const DoctorCheck&)>& out);

// Whether no check failed (warnings allowed).
bool healthy(const std::vector<DoctorCheck>& checks);

// The figures this project measured that a node is held against (docs/PERFORMANCE.md).
struct Reference {
  // The CPU's fp32 GEMM rate per core (a 1x1 convolution) on the reference machine kind, with
  // AVX-512 or AVX2 only (0 where none was measured).
  static double cpu_gemm_gflops_per_core(bool avx512);
  // ResNet-50 training on the CPU: the share of the measured GEMM rate a step reaches, at fp32
  // (24.6 GFLOP per image of forward and backward).
  static double cpu_resnet50_gemm_share();
  // ResNet-50 (224x224, batch 256, the engine's defaults) images/s on a GPU whose name
  // contains a measured model's, at this precision; 0 where none was measured.
  static double gpu_resnet50_images_per_sec(const std::string& gpu_name, const std::string& precision);
};

}  // namespace spotrain::health
