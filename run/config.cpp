// RunConfig validation and serialization (see config.h); the settings themselves are
// described in config.h's table.
#include "run/config.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <type_traits>

#include "spot/preempt_notice.h"
#include "core/error.h"
#include "engine/data.h"
#include "engine/precision.h"
#include "layers/resnet.h"

namespace spotrain {

double parse_duration(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit = end ? std::string(end) : "";
  double mult = unit == "h" ? 3600 : unit == "m" || unit == "min" ? 60 : unit == "s" || unit.empty() ? 1 : -1;
  SPOTRAIN_CHECK(end != s.c_str() && mult > 0 && v > 0, "bad duration '", s,
                 "'; use a number with h, m or s, e.g. 8h");
  return v * mult;
}

void check_thread_counts(int threads, int workers) {
  const int most = std::max(16, 4 * int(std::thread::hardware_concurrency()));
  SPOTRAIN_CHECK(threads >= 0 && threads <= most, "--threads must be in [0, ", most,
                 "] on this machine (", std::thread::hardware_concurrency(), " hardware threads; 0 = all), got ",
                 threads);
  SPOTRAIN_CHECK(workers >= 1 && workers <= most, "--workers must be in [1, ", most,
                 "] on this machine (", std::thread::hardware_concurrency(), " hardware threads), got ", workers);
}

void RunConfig::validate() const {
  check_resnet_options(model, grad_checkpoint);
  check_data_spec(data);
  SPOTRAIN_CHECK(batch_size > 0, "--batch-size must be positive, got ", batch_size);
  SPOTRAIN_CHECK(accum_steps >= 1, "--accum-steps must be at least 1, got ", accum_steps);
  SPOTRAIN_CHECK(std::isfinite(straggler_threshold) && straggler_threshold > 1,
                 "--straggler-threshold must be above 1 (a ratio to the median rank), got ", straggler_threshold);
  SPOTRAIN_CHECK(straggler_windows >= 1, "--straggler-windows must be at least 1, got ", straggler_windows);
  SPOTRAIN_CHECK(epochs > 0 || steps > 0, "--epochs or --steps must be positive");
  SPOTRAIN_CHECK(epochs >= 0 && steps >= 0, "--epochs and --steps must not be negative");
  SPOTRAIN_CHECK(std::isfinite(lr) && lr >= 0.f, "--lr must not be negative, got ", lr);
  SPOTRAIN_CHECK(momentum >= 0.f && momentum < 1.f, "--momentum must be in [0, 1), got ", momentum);
  SPOTRAIN_CHECK(weight_decay >= 0.f, "--weight-decay must not be negative, got ", weight_decay);
  SPOTRAIN_CHECK(label_smoothing >= 0.f && label_smoothing < 1.f,
                 "--label-smoothing must be in [0, 1), got ", label_smoothing);
  SPOTRAIN_CHECK(warmup_epochs >= 0.f, "--warmup-epochs must not be negative");
  SPOTRAIN_CHECK(std::isfinite(lr_poly_power) && lr_poly_power > 0.f,
                 "--lr-poly-power must be positive, got ", lr_poly_power);
  SPOTRAIN_CHECK(std::isfinite(lr_end) && lr_end >= 0.f, "--lr-end must not be negative, got ", lr_end);
  SPOTRAIN_CHECK(std::isfinite(lars_trust) && lars_trust > 0.f, "--lars-trust must be positive, got ",
                 lars_trust);
  SPOTRAIN_CHECK(std::isfinite(lars_epsilon) && lars_epsilon >= 0.f,
                 "--lars-epsilon must not be negative, got ", lars_epsilon);
  check_thread_counts(threads, workers);
  SPOTRAIN_CHECK(random_erasing >= 0.f && random_erasing <= 1.f,
                 "--random-erasing is a probability in [0, 1], got ", random_erasing);
  SPOTRAIN_CHECK(mixup >= 0.f && cutmix >= 0.f, "--mixup and --cutmix alphas must not be negative");
  SPOTRAIN_CHECK(mix_switch_prob >= 0.f && mix_switch_prob <= 1.f,
                 "--mix-switch-prob is a probability in [0, 1], got ", mix_switch_prob);
  SPOTRAIN_CHECK((mixup == 0.f && cutmix == 0.f) || batch_size % 2 == 0,
                 "--mixup/--cutmix mix neighbouring pairs of images: --batch-size must be even, got ",
                 batch_size);
  SPOTRAIN_CHECK(lr_per_256 >= 0.f, "--lr-per-256 must not be negative");
  SPOTRAIN_CHECK(ema_decay == 0 || (ema_decay > 0 && ema_decay < 1),
                 "--ema-decay must be in (0, 1) (0 = off), got ", ema_decay);
  SPOTRAIN_CHECK(prometheus.empty() || (prometheus.size() > 5 && prometheus.substr(prometheus.size() - 5) == ".prom"),
                 "--prometheus ", prometheus, ": the file name must end in .prom (node-exporter's "
                 "text-file collector reads only *.prom files)");
  SPOTRAIN_CHECK(prefetch >= 0, "--prefetch must not be negative");
  SPOTRAIN_CHECK(image_size >= 8, "--image-size must be at least 8, got ", image_size);
  SPOTRAIN_CHECK(max_bad_fraction >= 0 && max_bad_fraction <= 1,
                 "--max-bad-fraction must be in [0, 1], got ", max_bad_fraction);
  SPOTRAIN_CHECK(eval_every >= 0, "--eval-every must not be negative");
  SPOTRAIN_CHECK(log_every >= 1, "--log-every must be at least 1");
  parse_precision(precision);
  SPOTRAIN_CHECK(bucket_mb > 0, "--bucket-mb must be positive, got ", bucket_mb);
  SPOTRAIN_CHECK(grad_compression == "none" || grad_compression == "fp16" || grad_compression == "bf16",
                 "unknown --grad-compression '", grad_compression, "'; use none, fp16 or bf16");
  SPOTRAIN_CHECK(ckpt_every == "auto" || ckpt_every_steps() >= 0,
                 "--ckpt-every must be a number of steps (0 = none) or auto, got '", ckpt_every, "'");
  SPOTRAIN_CHECK(ckpt_every != "auto" || !mtbf.empty(),
                 "--ckpt-every auto needs --mtbf, the mean time between failures of one host (e.g. 6h)");
  if (!mtbf.empty()) parse_duration(mtbf);
  SPOTRAIN_CHECK(keep >= 1, "--keep must be at least 1");
  SPOTRAIN_CHECK(ckpt_every_min >= 0, "--ckpt-every-min must not be negative");
  SPOTRAIN_CHECK(lost_peer_save >= 0 && std::isfinite(lost_peer_save),
                 "--lost-peer-save must be a number of seconds (0 = off), got ", lost_peer_save);
  if (!max_wall_time.empty()) parse_duration(max_wall_time);
  SPOTRAIN_CHECK(!resume_from_folder() || !ckpt_dir.empty(), "--resume ", resume, " needs a --ckpt-dir");
  SPOTRAIN_CHECK(comm_timeout > 0, "--comm-timeout must be positive, got ", comm_timeout);
  SPOTRAIN_CHECK(loss_scale >= 0, "--loss-scale must not be negative, got ", loss_scale);
  SPOTRAIN_CHECK(max_overflow_steps > 0, "--max-overflow-steps must be positive");
  if (!preempt_notice.empty()) validate_preempt_notice(preempt_notice);
  SPOTRAIN_CHECK(preempt_poll > 0, "--preempt-poll must be positive, got ", preempt_poll);
  for_each_setting(*this, [](const SettingInfo& s, const auto& v) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) {
      if (!*s.choices) return;
      const std::string all = std::string("|") + s.choices + "|";
      SPOTRAIN_CHECK(all.find("|" + v + "|") != std::string::npos, "unknown ", s.flag, " '", v,
                     "'; use one of ", s.choices);
    }
  });
}

int64_t RunConfig::ckpt_every_steps() const {
  if (ckpt_every == "auto") return 0;
  char* end = nullptr;
  long long n = std::strtoll(ckpt_every.c_str(), &end, 10);
  return !ckpt_every.empty() && end && *end == 0 && n >= 0 ? int64_t(n) : -1;
}

std::string RunConfig::metrics_path() const {
  if (metrics == "none" || metrics.empty()) return "";
  if (metrics == "auto") return ckpt_dir.empty() ? "" : ckpt_dir + "/metrics.jsonl";
  return metrics;
}

double as_given(float v) {
  if (!std::isfinite(v)) return double(v);
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {  // 9 significant digits always read back
    std::snprintf(buf, sizeof buf, "%.*g", digits, double(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return std::strtod(buf, nullptr);
}

namespace {

template <class T>
nlohmann::json setting_json(const T& v) {
  if constexpr (std::is_same_v<T, float>) return as_given(v);
  else return v;
}

std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string RunConfig::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for_each_setting(*this, [&](const SettingInfo& s, const auto& v) { j[s.name] = setting_json(v); });
  return dump(j);
}

std::string RunConfig::to_toml() const {
  std::string out = "[train]\n";
  for_each_setting(*this, [&](const SettingInfo& s, const auto& v) {
    std::string flag = s.flag;
    flag = flag.substr(2, flag.find(',') - 2);  // "--augment,!--no-augment" -> "augment"
    out += flag + " = " + dump(setting_json(v)) + "\n";
  });
  return out;
}

}  // namespace spotrain
