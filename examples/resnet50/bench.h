// `spotrain bench`: synthetic-input training-step throughput (warm-up, then timed steps),
// per-phase breakdown, peak memory and machine description; optional JSON output.
#pragma once
#include <string>

namespace spotrain {

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
  std::string json;
  double price_per_hour = 0;
  uint64_t seed = 0;
};

int run_bench(const BenchOptions& opt);

}  // namespace spotrain
