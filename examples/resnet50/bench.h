// `spotrain bench`: training-step throughput on synthetic or real data (warm-up, then timed
// steps), per-phase breakdown with the data wait, per-rank and total images/s, peak memory,
// the machine, the cost of a 90-epoch ImageNet run; optional JSON output.
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
  std::string data = "synthetic";  // synthetic | imagefolder:DIR | shards:DIR (training transforms)
  int workers = 4;                  // loader threads for real data
  int prefetch = 4;                 // batches the loader prepares ahead
  double max_bad_fraction = 0.001;  // unreadable images tolerated (fraction of the set)
  std::string json;
  double price_per_hour = 0;
  uint64_t seed = 0;
  bool profile = false;  // time every op (device events on a GPU) and print where a step goes
};

int run_bench(const BenchOptions& opt);

}  // namespace spotrain
