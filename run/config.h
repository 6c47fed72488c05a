// The run configuration: every setting of `spotrain train`, each described once in the table
// below (type, name, default, command-line flag, help, how ranks treat it). The struct, the
// CLI options (and so the --config file's keys), the JSON that the metrics' start record and
// every checkpoint carry, and the start-up check that all ranks got the same settings are all
// made from that table: a new setting is one line there, and none can be forgotten.
#pragma once
#include <cstdint>
#include <string>

namespace spotrain {

// "8h", "90m", "3600s" or "3600" -> seconds; throws Error for anything else.
double parse_duration(const std::string& s);

// A float setting as the decimal a user would have written: the shortest that reads back as
// the same float (0.1f -> 0.1, where widening it gives 0.10000000149011612).
double as_given(float v);

// --threads (0 = all cores) and --workers (at least 1) checked against this machine: at most
// four per hardware thread (and never fewer than 16 allowed), so a typo such as 100000 is one
// error line instead of threads the process cannot make.
void check_thread_counts(int threads, int workers);

// How a setting is treated beyond being a flag and a JSON key.
enum SettingFlags : unsigned {
  kSettingPlain = 0,
  kShowDefault = 1u << 0,  // --help shows the default
  kPerNode = 1u << 1,      // may differ between ranks (not compared at start-up)
};

// X(type, name, default, flag, help, flags, choices): the JSON key is the name. A bool is an
// on/off flag ("--augment,!--no-augment" spells both forms). choices: the allowed values,
// "a|b|c", checked when the command line and config file are parsed ("" = any).
#define SPOTRAIN_RUN_SETTINGS(X)                                                                  \
  /* model and data */                                                                            \
  X(std::string, model, "resnet20", "--model",                                                    \
    "resnet18|34|50|101|152, or resnet20|32|44|56|110 (small input)", kShowDefault, "")               \
  X(std::string, data, "fashion-mnist", "--data",                                                 \
    "fashion-mnist[:DIR], imagefolder:DIR (DIR/train, DIR/val), shards:DIR or synthetic",         \
    kShowDefault, "")                                                                                 \
  X(int, image_size, 224, "--image-size",                                                         \
    "imagefolder/shards: training crop (eval: resize to size*256/224, center crop)", kShowDefault, "") \
  X(int64_t, train_limit, 0, "--train-limit",                                                     \
    "use only the first N training samples (0 = all; an image folder's are in class order)",      \
    kSettingPlain, "")                                                                                \
  X(int64_t, test_limit, 0, "--test-limit", "evaluate on the first N test samples (0 = all)",     \
    kSettingPlain, "")                                                                                \
  X(bool, augment, true, "--augment,!--no-augment",                                               \
    "training augmentation: pad-and-crop + flips (fashion-mnist), RandomResizedCrop + flips "     \
    "(imagefolder/shards; off: the eval crop)",                                                   \
    kShowDefault, "")                                                                                 \
  X(float, random_erasing, 0.0f, "--random-erasing",                                              \
    "probability of erasing a random box of each training image (torchvision RandomErasing: "    \
    "2-33% of the area, aspect 0.3-3.3, set to the mean); 0 = off", kShowDefault, "")             \
  X(float, mixup, 0.0f, "--mixup", "mixup alpha: pairs of training images and their labels "     \
    "mixed with weight ~ Beta(alpha, alpha); 0 = off", kShowDefault, "")                          \
  X(float, cutmix, 0.0f, "--cutmix", "cutmix alpha: a box of one image pasted into its pair's, "  \
    "labels mixed by area; 0 = off", kShowDefault, "")                                            \
  X(float, mix_switch_prob, 0.5f, "--mix-switch-prob",                                            \
    "with both --mixup and --cutmix: the chance a pair uses cutmix", kShowDefault, "")            \
  /* schedule and optimizer */                                                                    \
  X(int64_t, epochs, 3, "--epochs", "epochs to train", kShowDefault, "")                              \
  X(int64_t, steps, 0, "--steps", "train exactly this many steps (overrides --epochs)",           \
    kSettingPlain, "")                                                                                \
  X(int64_t, batch_size, 128, "--batch-size", "batch size per rank (and micro-batch)", kShowDefault, "") \
  X(int, accum_steps, 1, "--accum-steps",                                                         \
    "micro-batches per optimizer step on each rank (gradient accumulation): global batch = "     \
    "ranks x --batch-size x this; each micro-batch its own batch-norm statistics, as that many "  \
    "ranks would; a resume on another rank count keeps the global batch by changing it",          \
    kShowDefault, "")                                                                             \
  X(float, lr, 0.1f, "--lr", "peak learning rate", kShowDefault, "")                                  \
  X(float, lr_per_256, 0.0f, "--lr-per-256",                                                      \
    "peak learning rate per 256 images of the global batch: replaces --lr with this x global "   \
    "batch / 256, so a recipe keeps its schedule on any rank count (0 = use --lr)",               \
    kSettingPlain, "")                                                                            \
  X(double, ema_decay, 0.0, "--ema-decay",                                                        \
    "keep a moving average of the weights and BN statistics (e.g. 0.9998 per step), evaluated "  \
    "and checkpointed alongside the model; 0 = off", kSettingPlain, "")                           \
  X(float, momentum, 0.9f, "--momentum", "SGD momentum", kShowDefault, "")                            \
  X(bool, nesterov, false, "--nesterov", "Nesterov momentum", kSettingPlain, "")                      \
  X(float, weight_decay, 5e-4f, "--weight-decay", "L2 weight decay", kShowDefault, "")                \
  X(bool, decay_bn_and_bias, false, "--decay-bn-bias",                                            \
    "apply weight decay to BN scale/shift and biases too (excluded by default)", kSettingPlain, "")   \
  X(float, label_smoothing, 0.0f, "--label-smoothing", "label smoothing in [0, 1)", kShowDefault, "") \
  X(float, warmup_epochs, 0.0f, "--warmup-epochs", "linear warm-up length in epochs",             \
    kShowDefault, "")                                                                                 \
  X(std::string, lr_schedule, "cosine", "--lr-schedule",                                          \
    "cosine|step|constant|poly (step: x0.1 at 50% and 75%; poly: --lr-poly-power, --lr-end)",     \
    kShowDefault, "cosine|step|constant|poly")                                                    \
  X(float, lr_poly_power, 2.0f, "--lr-poly-power",                                                \
    "--lr-schedule poly: after the warm-up lr = (peak - end) x (1 - progress)^power + end "       \
    "(MLPerf ResNet-50 reference, lars_util.py: 2)", kShowDefault, "")                            \
  X(float, lr_end, 0.0001f, "--lr-end",                                                           \
    "--lr-schedule poly: the learning rate it decays to (MLPerf reference: 0.0001)",             \
    kShowDefault, "")                                                                             \
  X(std::string, optimizer, "sgd", "--optimizer",                                                 \
    "sgd (momentum, torch.optim.SGD) or lars (each layer's step scaled by its trust ratio, "     \
    "BN and biases left out; the MLPerf ResNet-50 reference's LARS); a resume must keep it",     \
    kShowDefault, "sgd|lars")                                                                     \
  X(float, lars_trust, 0.001f, "--lars-trust",                                                    \
    "--optimizer lars: the trust coefficient eeta in eeta x |w| / (|g| + wd x |w| + eps) "        \
    "(MLPerf reference: 0.001)", kShowDefault, "")                                                \
  X(float, lars_epsilon, 1e-7f, "--lars-epsilon",                                                 \
    "--optimizer lars: eps of the trust ratio (MLPerf reference: 0, which Keras makes 1e-7)",    \
    kShowDefault, "")                                                                             \
  X(bool, zero_init_residual, false, "--zero-init-residual",                                      \
    "start each block's last BN gamma at 0", kSettingPlain, "")                                       \
  X(std::string, grad_checkpoint, "none", "--grad-checkpoint",                                    \
    "none|selective|block|stage|every:K", kShowDefault, "")                                         \
  X(std::string, fusion, "auto", "--fusion",                                                      \
    "conv + batch-norm fusion in training: bn (a convolution makes the statistics of the BN+ReLU " \
    "after it, the next one applies that BN as it reads, and its backward goes through that BN; " \
    "cuDNN graphs on a GPU at fp16/bf16 where cuDNN takes the shape), auto (each such chain "    \
    "fused only where timing it at the first step says it wins; on the CPU and with "           \
    "--deterministic, none) or none", kShowDefault, "auto|bn|none")                               \
  X(std::string, precision, "fp32", "--precision", "fp32|tf32|bf16|fp16", kShowDefault, "fp32|tf32|bf16|fp16")           \
  X(double, loss_scale, 0, "--loss-scale", "fp16: static loss scale (0 = dynamic)", kShowDefault, "") \
  X(int64_t, max_overflow_steps, 50, "--max-overflow-steps",                                      \
    "fp16: stop after this many overflowed steps in a row", kShowDefault, "")                         \
  /* execution */                                                                                 \
  X(uint64_t, seed, 0, "--seed", "random seed (weights, data order, augmentation)", kShowDefault, "") \
  X(bool, deterministic, false, "--deterministic", "bitwise-reproducible runs", kSettingPlain, "")     \
  X(std::string, device, "auto", "--device", "auto|cpu|cuda", kShowDefault | kPerNode, "auto|cpu|cuda")            \
  X(bool, autotune, true, "--autotune,!--no-autotune",                                            \
    "GPU: time the candidate kernels of each convolution and fused graph at their first use "    \
    "and keep the fastest (else cuDNN's heuristics' first choice)", kShowDefault | kPerNode, "")  \
  X(std::string, kernel_cache, "auto", "--kernel-cache",                                          \
    "GPU: the file the timed kernel choices are kept in, per GPU, driver, cuDNN and shape, so a " \
    "restart skips the timing: auto (the run folder's kernel-cache.json; bench: "             \
    "~/.cache/spotrain/), none, or a path", kShowDefault | kPerNode, "")                          \
  X(bool, cuda_graph, true, "--cuda-graph,!--no-cuda-graph",                                     \
    "GPU, one rank: record a training step as a CUDA Graph once, then replay it each step "     \
    "(a no-op on the CPU and with several ranks)", kShowDefault | kPerNode, "")                 \
  X(int, threads, 0, "--threads", "compute threads (0 = all cores)", kPerNode, "")                    \
  X(int, workers, 1, "--workers", "data loader threads", kShowDefault | kPerNode, "")                 \
  X(int, prefetch, 2, "--prefetch", "batches the data loader prepares ahead",                     \
    kShowDefault | kPerNode, "")                                                                      \
  X(double, max_bad_fraction, 0.001, "--max-bad-fraction",                                        \
    "stop with an error when more than this fraction of images is unreadable", kShowDefault, "")      \
  /* distributed (comm/) */                                                                       \
  X(double, bucket_mb, 25, "--bucket-mb", "gradient all-reduce bucket size in MB", kShowDefault, "")  \
  X(std::string, grad_compression, "none", "--grad-compression", "none|fp16|bf16 all-reduce",     \
    kShowDefault, "none|fp16|bf16")                                                                                 \
  X(double, comm_timeout, 300, "--comm-timeout",                                                  \
    "seconds a collective may take before the job is aborted", kShowDefault | kPerNode, "")           \
  X(std::string, device_comm, "auto", "--device-comm",                                            \
    "GPU ranks: nccl, host (gradients through host memory over MPI, for ranks sharing a GPU) or " \
    "auto (nccl unless ranks share a GPU)", kShowDefault, "auto|nccl|host")                       \
  X(double, straggler_threshold, 1.2, "--straggler-threshold",                                   \
    "several ranks: a rank whose compute or input per step over a progress window takes at "     \
    "least this many times the median over ranks is named a straggler, with its host",           \
    kShowDefault, "")                                                                             \
  X(std::string, straggler_action, "rebalance", "--straggler-action",                           \
    "rebalance (each rank's share of the global batch, in whole micro-batches, follows its "     \
    "measured rate; micro-batches too coarse for the rates are halved, down to a quarter of the "  \
    "first and not below 8 images; off with --deterministic), warn (only name stragglers in the " \
    "log, metrics and --prometheus) or "                                                          \
    "leave (rebalance, and under mpirun.sh with HOST_DISCOVERY stop with a checkpoint to restart " \
    "without a host that stayed a straggler for --straggler-windows windows in a row when the "  \
    "goodput model says the rest of the run ends sooner without it)",                            \
    kShowDefault, "rebalance|warn|leave")                                                         \
  X(int, straggler_windows, 3, "--straggler-windows",                                             \
    "--straggler-action leave: progress windows in a row a host must be a straggler before "    \
    "leaving it is weighed", kShowDefault, "")                                                    \
  /* output */                                                                                    \
  X(int, log_every, 50, "--log-every", "progress line every N steps", kShowDefault, "")               \
  X(std::string, metrics, "auto", "--metrics",                                                  \
    "JSONL metrics file, appended (auto: metrics.jsonl in --ckpt-dir; none: no file)",            \
    kShowDefault | kPerNode, "")               \
  X(std::string, prometheus, "", "--prometheus",                                                  \
    "also write the latest figures to FILE.prom for node-exporter's text-file collector, "       \
    "replaced atomically at each progress line (by the first rank of each node)",                 \
    kPerNode, "")                                                                                 \
  X(bool, eval_each_epoch, true, "--eval-each-epoch,!--no-eval-each-epoch",                       \
    "evaluate on the test/val set after epochs (--eval-every); off: only at the end",             \
    kSettingPlain, "")                                                                                 \
  X(int64_t, eval_every, 1, "--eval-every",                                                       \
    "evaluate on the test/val set every N epochs (0 = at the end)", kShowDefault, "")                 \
  /* checkpoints and stopping */                                                                  \
  X(std::string, ckpt_dir, "runs/spotrain", "--ckpt-dir",                                         \
    "write checkpoints here (\"\" = none)", kShowDefault, "")                                         \
  X(std::string, ckpt_every, "0", "--ckpt-every",                                                  \
    "also write a checkpoint every N steps (0 = no), or auto: as often as the checkpoint's "      \
    "measured cost and --mtbf make best (Young/Daly)", kSettingPlain, "")                            \
  X(std::string, mtbf, "", "--mtbf",                                                              \
    "--ckpt-every auto: mean time between failures of one host, e.g. 6h, 90m", kSettingPlain, "") \
  X(int, keep, 3, "--keep", "checkpoints to keep", kShowDefault, "")                                  \
  X(std::string, ckpt_storage, "auto", "--ckpt-storage",                                          \
    "auto (found at start: does every rank see the same --ckpt-dir?), shared (rank 0 writes the " \
    "one copy) or node-local (the first rank of each node writes a copy on its own disk)",        \
    kShowDefault, "auto|shared|node-local")                                                       \
  X(double, ckpt_every_min, 0, "--ckpt-every-min", "also write a checkpoint every M minutes",     \
    kSettingPlain, "")                                                                                \
  X(std::string, on_ckpt_error, "stop", "--on-ckpt-error",                                        \
    "a background checkpoint that cannot be written (full disk, read-only folder): stop "        \
    "(exit 1, earlier checkpoints intact) or continue (warn, train on, try again at the next)",   \
    kShowDefault, "stop|continue")                                                                \
  X(double, lost_peer_save, 30, "--lost-peer-save",                                              \
    "when a peer is lost (a rank or host killed without notice, a link cut): seconds each "     \
    "surviving rank may take to save the last step every rank finished before the job ends "    \
    "(76); 0 = save nothing", kShowDefault, "")                                                  \
  X(std::string, max_wall_time, "", "--max-wall-time",                                            \
    "stop with a checkpoint (exit 75) before this much time, e.g. 8h, 90m", kSettingPlain, "")        \
  X(std::string, resume, "none", "--resume",                                                      \
    "none | auto (the newest checkpoint in --ckpt-dir, or from scratch when there is none) | "    \
    "latest (as auto, but refuse to start without one: for restarts) | PATH of a checkpoint "   \
    "(checkpoints after it in --ckpt-dir move to abandoned-<time>/)", kShowDefault, "")   \
  X(std::string, init_from, "", "--init-from",                                                    \
    "fine-tune: start from the weights of this checkpoint (ours, or torchvision's imported with " \
    "scripts/torch_interop.py import), each tensor whose name and shape match; the rest (a head " \
    "of another class count) start fresh. Not a resume: step 0, a new optimizer; a run that "    \
    "resumes ignores it", kSettingPlain, "")                                                      \
  X(std::string, preempt_notice, "", "--preempt-notice",                                         \
    "stop with a checkpoint (exit 75) when the cloud gives notice of a reclaim: "                \
    "aws|gcp|azure|http://HOST/PATH|file:PATH", kPerNode, "")                                     \
  X(double, preempt_poll, 5, "--preempt-poll", "seconds between preemption-notice checks",       \
    kShowDefault | kPerNode, "")                                                                  \
  X(bool, new_run, false, "--new-run",                                                            \
    "start a new run in a --ckpt-dir that holds another run: its files move to previous-<time>/", \
    kSettingPlain, "")                                                                            \
  X(std::string, plan, "", "--plan",                                                              \
    "the plan this run follows (`spotrain plan ... --json FILE`): kept in the run folder as "    \
    "plan.json, where `spotrain report` sets its predicted time, reclaims, goodput and cost "    \
    "beside what the run measured", kPerNode, "")

struct RunConfig {
#define SPOTRAIN_DECLARE_SETTING(type, name, def, flag, help, flags, choices) type name = def;
  SPOTRAIN_RUN_SETTINGS(SPOTRAIN_DECLARE_SETTING)
#undef SPOTRAIN_DECLARE_SETTING

  // Throws Error naming the first bad setting.
  void validate() const;
  // Every setting as a JSON object (keys: the names above); a float prints as given (0.1,
  // not the float's 0.10000000149011612).
  std::string to_json() const;
  // Every setting as a [train] section of a --config file, one `key = value` line each.
  std::string to_toml() const;
  // The metrics file this run writes ("" = none): --metrics, with auto resolved.
  std::string metrics_path() const;
  // --resume auto or latest: the checkpoint is looked for in --ckpt-dir (not a named file).
  bool resume_from_folder() const { return resume == "auto" || resume == "latest"; }
  // --ckpt-every as a number of steps: 0 for none or auto, -1 when it is neither a number nor auto.
  int64_t ckpt_every_steps() const;
};

// One setting's description, as for_each_setting passes it.
struct SettingInfo {
  const char* name;
  const char* flag;
  const char* help;
  unsigned flags;
  const char* choices;  // "a|b|c", or "" (any value)
};

// Calls f(info, value) for each setting of `c` (RunConfig or const RunConfig), in table order.
template <class Config, class F>
void for_each_setting(Config& c, F&& f) {
#define SPOTRAIN_VISIT_SETTING(type, name, def, flag, help, flags, choices) \
  f(SettingInfo{#name, flag, help, flags, choices}, c.name);
  SPOTRAIN_RUN_SETTINGS(SPOTRAIN_VISIT_SETTING)
#undef SPOTRAIN_VISIT_SETTING
}

}  // namespace spotrain
