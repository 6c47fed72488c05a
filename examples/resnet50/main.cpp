// The `spotrain` command line: train, eval and bench subcommands. Errors become one
// `error:` line on stderr and exit code 1; a bad command line exits 2.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoints/checkpoint.h"
#include "checkpoints/preemption.h"
#include "io/image_folder.h"
#include "layers/resnet.h"

#include "engine/config.h"
#include "engine/error.h"
#include "engine/log.h"
#include "engine/trainer.h"
#include "examples/resnet50/bench.h"
#include "kernels/cuda/device_info.h"

namespace {

void add_train_options(CLI::App& c, spotrain::RunConfig& cfg) {
  c.add_option("--model", cfg.model, "resnet18|34|50|101|152, or resnet20|32|44|56|110 (small input)")
      ->capture_default_str();
  c.add_option("--data", cfg.data,
               "fashion-mnist[:DIR], imagefolder:DIR (DIR/train, DIR/val), shards:DIR or synthetic")
      ->capture_default_str();
  c.add_option("--image-size", cfg.image_size,
               "imagefolder/shards: training crop (eval: resize to size*256/224, center crop)")
      ->capture_default_str();
  c.add_option("--max-bad-fraction", cfg.max_bad_fraction,
               "stop with an error when more than this fraction of images is unreadable")
      ->capture_default_str();
  c.add_option("--prefetch", cfg.prefetch, "batches the data loader prepares ahead")
      ->capture_default_str();
  c.add_option("--eval-every", cfg.eval_every, "evaluate on the test/val set every N epochs (0 = at the end)")
      ->capture_default_str();
  c.add_option("--train-limit", cfg.train_limit,
               "use only the first N training samples (0 = all; an image folder's are in class order)");
  c.add_option("--test-limit", cfg.test_limit, "evaluate on the first N test samples (0 = all)");
  c.add_flag("--augment,!--no-augment", cfg.augment,
             "training augmentation: pad-and-crop + flips (fashion-mnist), RandomResizedCrop + flips "
             "(imagefolder/shards; off: the eval crop)")
      ->capture_default_str();
  c.add_option("--epochs", cfg.epochs, "epochs to train")->capture_default_str();
  c.add_option("--steps", cfg.steps, "train exactly this many steps (overrides --epochs)");
  c.add_option("--batch-size", cfg.batch_size, "batch size per rank")->capture_default_str();
  c.add_option("--lr", cfg.lr, "peak learning rate")->capture_default_str();
  c.add_option("--momentum", cfg.momentum, "SGD momentum")->capture_default_str();
  c.add_flag("--nesterov", cfg.nesterov, "Nesterov momentum");
  c.add_option("--weight-decay", cfg.weight_decay, "L2 weight decay")->capture_default_str();
  c.add_flag("--decay-bn-bias", cfg.decay_bn_and_bias,
             "apply weight decay to BN scale/shift and biases too (excluded by default)");
  c.add_option("--label-smoothing", cfg.label_smoothing, "label smoothing in [0, 1)")
      ->capture_default_str();
  c.add_option("--warmup-epochs", cfg.warmup_epochs, "linear warm-up length in epochs")
      ->capture_default_str();
  c.add_option("--lr-schedule", cfg.lr_schedule, "cosine|step|constant (step: x0.1 at 50% and 75%)")
      ->capture_default_str();
  c.add_flag("--zero-init-residual", cfg.zero_init_residual, "start each block's last BN gamma at 0");
  c.add_option("--grad-checkpoint", cfg.grad_checkpoint, "none|block|stage|every:K")
      ->capture_default_str();
  c.add_option("--precision", cfg.precision, "fp32|tf32|bf16|fp16")->capture_default_str();
  c.add_option("--loss-scale", cfg.loss_scale, "fp16: static loss scale (0 = dynamic)")
      ->capture_default_str();
  c.add_option("--max-overflow-steps", cfg.max_overflow_steps,
               "fp16: stop after this many overflowed steps in a row")
      ->capture_default_str();
  c.add_option("--seed", cfg.seed, "random seed (weights, data order, augmentation)")
      ->capture_default_str();
  c.add_flag("--deterministic", cfg.deterministic, "bitwise-reproducible runs");
  c.add_option("--device", cfg.device, "auto|cpu|cuda")->capture_default_str();
  c.add_option("--threads", cfg.threads, "compute threads (0 = all cores)");
  c.add_option("--workers", cfg.workers, "data loader threads")->capture_default_str();
  c.add_option("--log-every", cfg.log_every, "progress line every N steps")->capture_default_str();
  c.add_option("--metrics", cfg.metrics, "write JSONL metrics to FILE");
  c.add_option("--ckpt-every", cfg.ckpt_every, "also write a checkpoint every N steps (0 = no)");
  c.add_option("--keep", cfg.keep, "checkpoints to keep")->capture_default_str();
  c.add_option("--ckpt-every-min", cfg.ckpt_every_min, "also write a checkpoint every M minutes");
  c.add_option("--max-wall-time", cfg.max_wall_time,
               "stop with a checkpoint (exit 75) before this much time, e.g. 8h, 90m");
  c.add_option("--resume", cfg.resume,
               "none | auto (newest checkpoint in --ckpt-dir) | PATH of a checkpoint")
      ->capture_default_str();
  c.add_option("--bucket-mb", cfg.bucket_mb, "gradient all-reduce bucket size in MB")
      ->capture_default_str();
  c.add_option("--grad-compression", cfg.grad_compression, "none|fp16|bf16 all-reduce")
      ->capture_default_str();
  c.add_option("--comm-timeout", cfg.comm_timeout,
               "seconds a collective may take before the job is aborted")
      ->capture_default_str();
  c.add_option("--ckpt-dir", cfg.ckpt_dir, "write a checkpoint here when training ends (\"\" = none)")
      ->capture_default_str();
}

struct EvalOptions {
  std::string ckpt, data, device = "auto", dump;
  int64_t batch_size = 256, test_limit = 0;
  int threads = 0, workers = 1, image_size = 0;
  double max_bad_fraction = 0.001;
};

// Writes a float32 tensor as a NumPy .npy file (format 1.0, little-endian, C order).
void write_npy(const std::string& path, const std::vector<int64_t>& shape, const float* data) {
  std::string dims;
  int64_t n = 1;
  for (auto d : shape) {
    dims += std::to_string(d) + ",";
    n *= d;
  }
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  uint16_t len = uint16_t(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(reinterpret_cast<const char*>(&len), 2);
  f << header;
  f.write(reinterpret_cast<const char*>(data), std::streamsize(n * 4));
  SPOTRAIN_CHECK(f.good(), "cannot write ", path);
}

// `spotrain data pack SRC OUT`: each split folder SRC/train, SRC/val -> OUT/train, OUT/val.
int run_data_pack(const std::string& src, const std::string& out, const std::string& shard_size) {
  namespace fs = std::filesystem;
  const int64_t shard_bytes = spotrain::io::parse_bytes(shard_size);
  SPOTRAIN_CHECK(fs::is_directory(src + "/train") || fs::is_directory(src + "/val"), src,
                 " has neither train/ nor val/ (expected SRC/train/<class>/*.JPEG)");
  std::vector<std::string> classes;
  for (const char* split : {"train", "val"}) {
    const std::string dir = src + "/" + split;
    if (!fs::is_directory(dir)) continue;
    auto folder = spotrain::io::open_image_folder(dir, classes);
    if (classes.empty()) classes = folder->class_names();
    auto st = spotrain::io::pack_shards(*folder, out + "/" + split, shard_bytes);
    spotrain::log_info(spotrain::str("packed ", dir, ": ", st.records, " images, ", folder->num_classes(),
                                     " classes, ", spotrain::fmt_fixed(double(st.bytes) / (1 << 20), 1),
                                     " MiB in ", st.shards, " shard(s) -> ", out, "/", split));
  }
  return 0;
}

// `spotrain data verify OUT`: every split under OUT (or OUT itself).
int run_data_verify(const std::string& out) {
  namespace fs = std::filesystem;
  std::vector<std::string> dirs;
  if (fs::exists(out + "/index.bin")) dirs.push_back(out);
  for (const char* split : {"train", "val"})
    if (fs::is_directory(out + "/" + split)) dirs.push_back(out + "/" + split);
  SPOTRAIN_CHECK(!dirs.empty(), out, " holds no packed shards (index.bin, train/ or val/)");
  size_t problems = 0;
  for (auto& d : dirs) {
    std::vector<std::string> notes;
    auto p = spotrain::io::verify_shards(d, &notes);
    for (auto& line : notes) std::fprintf(stderr, "%s: note: %s (the loader will skip it)\n", d.c_str(), line.c_str());
    for (auto& line : p) std::fprintf(stderr, "%s: %s\n", d.c_str(), line.c_str());
    if (p.empty()) std::printf("%s: OK\n", d.c_str());
    problems += p.size();
  }
  SPOTRAIN_CHECK(problems == 0, problems, " problem(s) found in ", out, "; re-pack it with `spotrain data pack`");
  return 0;
}

// `spotrain eval`: top-1 / top-5 of a checkpoint over a whole test set.
int run_eval(const EvalOptions& o) {
  namespace fs = std::filesystem;
  std::string path = o.ckpt;
  if (fs::is_directory(path)) {  // newest ckpt-*.h5 in the directory
    std::string best;
    for (auto& e : fs::directory_iterator(path)) {
      auto n = e.path().filename().string();
      if (n.rfind("ckpt-", 0) == 0 && e.path().extension() == ".h5" && n > best) best = n;
    }
    SPOTRAIN_CHECK(!best.empty(), "no ckpt-*.h5 checkpoint in ", path);
    path = (fs::path(path) / best).string();
  }
  auto info = spotrain::read_checkpoint_info(path);
  auto cfg_json = nlohmann::json::parse(info.config_json, nullptr, false);
  std::string data = o.data;
  if (data.empty() && cfg_json.is_object() && cfg_json.contains("data")) data = cfg_json["data"];
  SPOTRAIN_CHECK(!data.empty(), "pass --data: the checkpoint does not say what it was trained on");
  SPOTRAIN_CHECK(o.batch_size > 0, "--batch-size must be positive, got ", o.batch_size);
  int image_size = o.image_size;
  if (image_size <= 0 && cfg_json.is_object() && cfg_json.contains("image_size"))
    image_size = cfg_json["image_size"].get<int>();
  if (image_size <= 0) image_size = 224;
  auto pair = spotrain::open_data(data, 1, o.test_limit, 0, image_size);
  SPOTRAIN_CHECK(pair.test->num_classes() == info.num_classes &&
                     pair.test->image_shape().c == info.in_channels,
                 "checkpoint ", path, " was trained for ", info.num_classes, " classes of ",
                 info.in_channels, "-channel images; --data ", data, " does not match");
  spotrain::BackendOptions bo;
  bo.threads = o.threads;
  auto be = spotrain::make_backend(o.device, bo);
  spotrain::ResNetOptions ro;
  ro.arch = info.model;
  ro.num_classes = info.num_classes;
  ro.in_channels = info.in_channels;
  spotrain::Model model(spotrain::build_resnet(ro), *be);
  spotrain::load_checkpoint_weights(path, model);
  spotrain::EvalBatchHook dump;
  if (!o.dump.empty()) {  // the first batch's inputs (NCHW) and logits, for interop checks
    dump = [&o, &be, first = true](const spotrain::io::Batch& b, const spotrain::Tensor& logits) mutable {
      if (!first) return;
      first = false;
      const auto& s = b.images.shape();  // logical (N, C, H, W), stored NHWC
      int64_t N = s[0], C = s[1], H = s[2], W = s[3];
      std::vector<float> nchw(size_t(N * C * H * W));
      const float* src = b.images.data<float>();
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t i = 0; i < H * W; ++i)
            nchw[size_t((n * C + c) * H * W + i)] = src[(n * H * W + i) * C + c];
      write_npy(o.dump + ".inputs.npy", {N, C, H, W}, nchw.data());
      spotrain::Tensor l = be->to_host(logits);
      write_npy(o.dump + ".logits.npy", {l.shape()[0], l.shape()[1]}, l.data<float>());
    };
  }
  auto r = spotrain::evaluate_model(model, *pair.test, pair.kind, o.batch_size, spotrain::DType::f32,
                                    nullptr, o.workers, o.max_bad_fraction, dump);
  spotrain::log_info(spotrain::str("eval ", path, " (", info.model, ", step ", info.global_step,
                                   ") on ", r.samples, " images: top-1 ",
                                   spotrain::fmt_fixed(100 * r.top1, 2), "% top-5 ",
                                   spotrain::fmt_fixed(100 * r.top5, 2), "% loss ",
                                   spotrain::fmt_fixed(r.loss, 4)));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"spotrain: data-parallel ResNet training that survives spot interruptions"};
  app.require_subcommand(1);
  app.set_config("--config", "", "read options from a TOML/INI file ([train] / [bench] sections)");
  app.set_version_flag("--version", [] {
    const auto& g = spotrain::gpu_info();
    return spotrain::str("spotrain ", SPOTRAIN_VERSION, " (built with ", g.built_with, ")\n",
                         spotrain::gpu_info_line(g));
  }, "print the version, the GPU and the CUDA library versions, and exit");

  spotrain::RunConfig cfg;
  auto* train = app.add_subcommand("train", "train a model");
  add_train_options(*train, cfg);

  EvalOptions eo;
  auto* eval = app.add_subcommand("eval", "top-1 / top-5 of a checkpoint over a whole test set");
  eval->add_option("--ckpt", eo.ckpt, "checkpoint file, or a directory (its newest ckpt-*.h5)")
      ->required();
  eval->add_option("--data", eo.data,
                   "fashion-mnist[:DIR], imagefolder:DIR, shards:DIR or synthetic (default: as trained)");
  eval->add_option("--image-size", eo.image_size, "imagefolder/shards crop (default: as trained)");
  eval->add_option("--workers", eo.workers, "data loader threads")->capture_default_str();
  eval->add_option("--max-bad-fraction", eo.max_bad_fraction,
                   "stop when more than this fraction of images is unreadable")
      ->capture_default_str();
  eval->add_option("--batch-size", eo.batch_size, "batch size")->capture_default_str();
  eval->add_option("--test-limit", eo.test_limit, "evaluate on the first N images (0 = all)");
  eval->add_option("--device", eo.device, "auto|cpu|cuda")->capture_default_str();
  eval->add_option("--threads", eo.threads, "compute threads (0 = all cores)");
  eval->add_option("--dump-logits", eo.dump,
                   "write the first batch's inputs and logits to PREFIX.inputs.npy / "
                   "PREFIX.logits.npy (for scripts/torch_interop.py check)");

  std::string ckpt_file;
  auto* ckpt = app.add_subcommand("ckpt", "inspect or verify a checkpoint file");
  ckpt->require_subcommand(1);
  auto* ckpt_info = ckpt->add_subcommand("info", "print step, epoch, model, precision, sizes, config");
  ckpt_info->add_option("file", ckpt_file, "checkpoint file")->required();
  auto* ckpt_verify = ckpt->add_subcommand("verify", "check format, attributes and every checksum");
  ckpt_verify->add_option("file", ckpt_file, "checkpoint file")->required();

  std::string pack_src, pack_out, shard_size = "1GiB";
  auto* data_cmd = app.add_subcommand("data", "pack an image folder into shards, or verify shards");
  data_cmd->require_subcommand(1);
  auto* data_pack = data_cmd->add_subcommand("pack", "SRC/{train,val}/<class>/*.JPEG -> OUT/{train,val} shards");
  data_pack->add_option("src", pack_src, "image folder root (with train/ and/or val/)")->required();
  data_pack->add_option("out", pack_out, "output directory")->required();
  data_pack->add_option("--shard-size", shard_size, "bytes per shard file, e.g. 1GiB, 256MiB")
      ->capture_default_str();
  auto* data_verify = data_cmd->add_subcommand("verify", "check shard headers, lengths and CRC-32s");
  data_verify->add_option("out", pack_out, "directory written by data pack")->required();

  spotrain::BenchOptions bo;
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

  // `--config FILE` is an option of the whole program (its [train] / [bench] sections hold
  // each subcommand's keys); accept it after the subcommand too by moving it to the front.
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) args.push_back(argv[i]);  // CLI11 wants reverse order
  for (size_t i = args.size(); i-- > 0;) {
    std::string a = args[i];
    if (a.rfind("--config=", 0) == 0) {
      args.erase(args.begin() + long(i));
      args.push_back(a);
    } else if (a == "--config" && i > 0) {
      std::string v = args[i - 1];
      args.erase(args.begin() + long(i) - 1, args.begin() + long(i) + 1);
      args.push_back(v);
      args.push_back(a);
    }
  }
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (see spotrain --help)\n", e.what());
    return 2;
  }

  try {
    if (*train) {
      spotrain::Trainer t(cfg);
      auto r = t.run();
      if (r.stopped) return spotrain::kExitResumable;
      spotrain::log_info(spotrain::str("finished ", r.steps, " steps in ",
                                       spotrain::fmt_duration(r.seconds), "; test top-1 ",
                                       spotrain::fmt_fixed(100 * r.test.top1, 2), "% top-5 ",
                                       spotrain::fmt_fixed(100 * r.test.top5, 2), "%",
                                       t.scaler().enabled()
                                           ? spotrain::str("; ", r.skipped_steps,
                                                           " overflowed steps skipped, loss scale ",
                                                           r.loss_scale)
                                           : std::string()));
      return 0;
    }
    if (*bench) return spotrain::run_bench(bo);
    if (*eval) return run_eval(eo);
    if (*data_pack) return run_data_pack(pack_src, pack_out, shard_size);
    if (*data_verify) return run_data_verify(pack_out);
    if (*ckpt_verify) {
      spotrain::verify_checkpoint(ckpt_file, nullptr);
      std::printf("%s: OK\n", ckpt_file.c_str());
      return 0;
    }
    if (*ckpt_info) {
      auto info = spotrain::read_checkpoint_info(ckpt_file);
      std::printf("file          %s (%.1f MiB)\nformat        %d\nmodel         %s (%d classes, %d input "
                  "channels)\nprecision     %s\nglobal step   %lld\nepoch         %lld, batch %lld "
                  "(%lld samples of the epoch)\nglobal batch  %lld on %d rank(s), seed %llu\n"
                  "loss scale    %s\nconfig        %s\n",
                  ckpt_file.c_str(), double(std::filesystem::file_size(ckpt_file)) / (1 << 20),
                  info.format_version, info.model.c_str(), info.num_classes, info.in_channels,
                  info.precision.c_str(), static_cast<long long>(info.global_step),
                  static_cast<long long>(info.epoch + 1), static_cast<long long>(info.batch_in_epoch),
                  static_cast<long long>(info.samples_in_epoch),
                  static_cast<long long>(info.global_batch), info.world_size,
                  static_cast<unsigned long long>(info.seed),
                  info.precision == "fp16"
                      ? spotrain::str(info.scaler.scale, " (", info.scaler.skipped_steps,
                                      " skipped steps)").c_str()
                      : "none (no fp16 loss scaling)",
                  info.config_json.c_str());
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
