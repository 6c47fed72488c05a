// `spotrain eval`: top-1 / top-5 and the loss of a checkpoint over a whole test set, on one
// process; optionally the first batch's inputs and logits as .npy files for interop checks.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoints/checkpoint.h"
#include "engine/checkpoint_state.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/data.h"
#include "engine/evaluate.h"
#include "engine/session.h"
#include "run/config.h"
#include "tools/spotrain/commands.h"

namespace spotrain::cli {

namespace {

struct EvalOptions {
  std::string ckpt, data, device = "auto", dump, json;
  int64_t batch_size = 256, test_limit = 0;
  int threads = 0, workers = 1, image_size = 0;
  bool ema = false;
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

// `spotrain eval`: top-1 / top-5 of a checkpoint over a whole test set.
int run_eval(const EvalOptions& o) {
  std::string path = o.ckpt;
  if (std::filesystem::is_directory(path)) {  // the newest good checkpoint in the folder
    std::vector<std::string> skipped;
    path = spotrain::newest_good_checkpoint(o.ckpt, spotrain::checkpoint_expectation(false), &skipped);
    SPOTRAIN_CHECK(!path.empty(), "no usable ckpt-*.h5 checkpoint in ", o.ckpt,
                   spotrain::skipped_checkpoints_text(skipped));
  }
  spotrain::check_thread_counts(o.threads, o.workers);
  auto info = spotrain::read_checkpoint_info(path);
  spotrain::check_recorded_model(path, info);
  auto cfg_json = nlohmann::json::parse(info.config_json, nullptr, false);
  std::string data = o.data;
  // The stored settings are only defaults here: a value of the wrong type is ignored, and
  // --data must then be given.
  if (data.empty() && cfg_json.is_object() && cfg_json.contains("data") && cfg_json["data"].is_string())
    data = cfg_json["data"].get<std::string>();
  SPOTRAIN_CHECK(!data.empty(), "pass --data: checkpoint ", path,
                 " does not record what it was trained on (its run config has no data set)");
  const bool data_from_file = o.data.empty();
  SPOTRAIN_CHECK(o.batch_size > 0, "--batch-size must be positive, got ", o.batch_size);
  int image_size = o.image_size;
  if (image_size <= 0 && cfg_json.is_object() && cfg_json.contains("image_size") &&
      cfg_json["image_size"].is_number_integer())
    image_size = cfg_json["image_size"].get<int>();
  if (image_size <= 0) image_size = 224;
  spotrain::DataPair pair;
  try {
    pair = spotrain::open_data(data, 1, o.test_limit, 0, image_size);
  } catch (const spotrain::Error& e) {
    if (!data_from_file) throw;
    SPOTRAIN_THROW("the data set recorded in checkpoint ", path, " (", data, "): ", e.what(),
                   "; pass --data to evaluate on another");
  }
  SPOTRAIN_CHECK(pair.test->num_classes() == info.num_classes &&
                     pair.test->image_shape().c == info.in_channels,
                 "checkpoint ", path, " was trained for ", info.num_classes, " classes of ",
                 info.in_channels, "-channel images; --data ", data, " does not match");
  spotrain::SessionOptions so;
  so.comm = "local";  // evaluation runs on one process
  so.device = o.device;
  so.backend.threads = o.threads;
  spotrain::Session session(so);
  spotrain::Backend* be = &session.backend();
  spotrain::ResNetOptions ro;
  ro.arch = info.model;
  ro.num_classes = info.num_classes;
  ro.in_channels = info.in_channels;
  auto model_ptr = session.make_model(ro, 0);
  spotrain::Model& model = *model_ptr;
  spotrain::load_checkpoint_weights(path, model, o.ema ? "ema" : "model");
  spotrain::EvalBatchHook dump;
  if (!o.dump.empty()) {  // the first batch's inputs (NCHW) and logits, for interop checks
    dump = [&o, be, first = true](const spotrain::io::Batch& b, const spotrain::Tensor& logits) mutable {
      if (!first) return;
      first = false;
      const auto& s = b.images.shape();  // logical (N, C, H, W), stored NHWC
      int64_t N = s[0], C = s[1], H = s[2], W = s[3];
      std::vector<float> nchw(size_t(N * C * H * W));
      const float* src = b.images.data<float>();  // evaluation batches are fp32 (no pixels_u8)
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
  spotrain::log_info(spotrain::str("eval ", path, o.ema ? " (moving average)" : "", " (", info.model, ", step ", info.global_step,
                                   ") on ", r.samples, " images: top-1 ",
                                   spotrain::fmt_fixed(100 * r.top1, 2), "% top-5 ",
                                   spotrain::fmt_fixed(100 * r.top5, 2), "% loss ",
                                   spotrain::fmt_fixed(r.loss, 4)));
  if (!o.json.empty()) {  // for scripts, and for `spotrain report` when it is in the run folder
    nlohmann::json j{{"checkpoint", std::filesystem::absolute(path).string()},
                     {"model", info.model},
                     {"step", info.global_step},
                     {"weights", o.ema ? "ema" : "model"},
                     {"epochs_done", info.epoch},
                     {"batches_into_next_epoch", info.batch_in_epoch},
                     {"data", data},
                     {"images", r.samples},
                     {"top1", r.top1},
                     {"top5", r.top5},
                     {"loss", r.loss},
                     {"backend", be->name()},
                     {"time", spotrain::utc_time_iso()}};
    write_file_atomic(o.json, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", "the --json file");
  }
  return 0;
}

}  // namespace

Command add_eval(CLI::App& app) {
  auto opts = std::make_shared<EvalOptions>();
  EvalOptions& eo = *opts;
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
  eval->add_flag("--ema", eo.ema,
                 "evaluate the checkpoint's moving average of the weights (runs with --ema-decay)");
  eval->add_option("--json", eo.json,
                   "also write the result as one JSON object to FILE (top1/top5 as fractions); "
                   "name it eval*.json inside the run folder and `spotrain report` shows it");
  eval->add_option("--dump-logits", eo.dump,
                   "write the first batch's inputs and logits to PREFIX.inputs.npy / "
                   "PREFIX.logits.npy (for scripts/torch_interop.py check)");
  return {eval, [opts] { return run_eval(*opts); }};
}

}  // namespace spotrain::cli
