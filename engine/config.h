// The run configuration: every setting of `spotrain train` in one plain struct, filled by
// the CLI (flags or --config file) and validated once before anything heavy starts.
#pragma once
#include <cstdint>
#include <string>

namespace spotrain {

// "8h", "90m", "3600s" or "3600" -> seconds; throws Error for anything else.
double parse_duration(const std::string& s);

struct RunConfig {
  // model and data
  std::string model = "resnet20";
  std::string data = "fashion-mnist";  // fashion-mnist[:DIR] | imagefolder:DIR | shards:DIR | synthetic
  int image_size = 224;                // imagefolder/shards: crop size (eval resizes to size*256/224)
  int64_t train_limit = 0;             // use only the first N training samples (0 = all)
  int64_t test_limit = 0;              // evaluate on the first N test samples (0 = all)
  bool augment = true;                 // pad-and-crop + flip for training
  // schedule
  int64_t epochs = 3;
  int64_t steps = 0;  // when > 0 overrides epochs: train exactly this many steps
  int64_t batch_size = 128;
  float lr = 0.1f;
  float momentum = 0.9f;
  bool nesterov = false;
  float weight_decay = 5e-4f;
  bool decay_bn_and_bias = false;
  float label_smoothing = 0.0f;
  float warmup_epochs = 0.0f;
  std::string lr_schedule = "cosine";
  bool zero_init_residual = false;
  std::string grad_checkpoint = "none";
  std::string precision = "fp32";  // fp32 | tf32 | bf16 | fp16
  double loss_scale = 0;            // fp16: 0 = dynamic, > 0 = static scale
  int64_t max_overflow_steps = 50;  // fp16: stop after this many overflowed steps in a row
  // execution
  uint64_t seed = 0;
  bool deterministic = false;
  std::string device = "auto";
  int threads = 0;
  int workers = 1;
  int prefetch = 2;                // batches the loader prepares ahead
  double max_bad_fraction = 0.001; // stop when more than this fraction of images is unreadable
  // distributed (comm/)
  double bucket_mb = 25;
  std::string grad_compression = "none";  // none | fp16 | bf16
  double comm_timeout = 300;              // seconds before a stuck collective aborts the job
  // output
  int log_every = 50;
  std::string metrics;  // JSONL file ("" = none)
  bool eval_each_epoch = true;
  int64_t eval_every = 1;  // evaluate every N epochs (0 = only at the end)
  std::string ckpt_dir = "runs/spotrain";  // checkpoints go here ("" = none)
  int64_t ckpt_every = 0;                  // also every N steps (0 = only at the end / on stop)
  int keep = 3;                            // checkpoints kept (older ones are removed)
  double ckpt_every_min = 0;               // also every M minutes of training (0 = no)
  std::string max_wall_time;               // e.g. "8h", "90m", "3600s": stop (exit 75) before it
  std::string resume = "none";             // none | auto (newest in ckpt_dir) | PATH

  // Throws Error naming the first bad setting.
  void validate() const;
  std::string to_json() const;
};

}  // namespace spotrain
