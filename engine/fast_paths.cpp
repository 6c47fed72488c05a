// FastPathChecks (see fast_paths.h).
#include "engine/fast_paths.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"

namespace spotrain {

double fast_path_tolerance(OpKind kind, OpPrecision precision) { return 2 * op_tolerance(kind, precision); }

namespace {

double nerr(const float* got, const float* want, size_t n) {
  double d = 0, w = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isfinite(want[i]) && !std::isfinite(got[i])) return INFINITY;
    d += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    w += double(want[i]) * want[i];
  }
  if (d == 0) return 0;
  return std::sqrt(d) / std::max(std::sqrt(w), 1e-30);
}

}  // namespace

double normalized_difference(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  return nerr(got.data(), want.data(), got.size());
}

double normalized_difference(const Tensor& got, const Tensor& want) {
  SPOTRAIN_CHECK(got.dtype() == DType::f32 && want.dtype() == DType::f32,
                 "internal: normalized_difference of ", got.describe(), " and ", want.describe());
  if (got.shape() != want.shape()) return INFINITY;
  return nerr(got.data<float>(), want.data<float>(), size_t(got.numel()));
}

FastPathChecks::FastPathChecks(std::string path, std::string device)
    : path_(std::move(path)), device_(std::move(device)) {
  if (path_.empty()) return;
  std::ifstream in(path_);
  if (!in) return;  // none yet
  std::stringstream ss;
  ss << in.rdbuf();
  file_text_ = ss.str();
  try {
    const nlohmann::json j = nlohmann::json::parse(file_text_);
    const auto dev = j.at("devices").find(device_);
    if (dev == j.at("devices").end()) return;
    for (auto it = dev->begin(); it != dev->end(); ++it) off_[it.key()] = it.value().get<std::string>();
  } catch (const std::exception& e) {
    log_info(str("warning: ", path_, " cannot be read (", e.what(),
                 "); the fast paths are checked again and the file rewritten"));
    file_text_.clear();
  }
}

bool FastPathChecks::off(const std::string& fast_path) const { return off_.count(fast_path) > 0; }

std::string FastPathChecks::why_off(const std::string& fast_path) const {
  auto it = off_.find(fast_path);
  return it == off_.end() ? std::string() : it->second;
}

void FastPathChecks::passed(const std::string& fast_path, const std::string& figure) {
  checked_[fast_path] = "passed: " + figure;
}

void FastPathChecks::failed(const std::string& fast_path, const std::string& difference) {
  checked_[fast_path] = "failed: " + difference;
  off_[fast_path] = difference;
  log_info(str("warning: ", fast_path, " turned off for this run: its first-use check found ",
               difference, path_.empty() ? "" : str(" (kept in ", path_, ")")));
  save();
}

void FastPathChecks::save() {
  if (path_.empty()) return;
  nlohmann::json j;
  try {
    if (!file_text_.empty()) j = nlohmann::json::parse(file_text_);
  } catch (const std::exception&) {
    j = nlohmann::json();
  }
  if (!j.is_object() || !j.contains("devices") || !j["devices"].is_object())
    j = {{"devices", nlohmann::json::object()}};
  nlohmann::json& mine = j["devices"][device_];
  mine = nlohmann::json::object();
  for (const auto& [k, v] : off_) mine[k] = v;
  try {
    file_text_ = j.dump(2) + "\n";
    write_file_atomic(path_, file_text_, "the fast paths' verdicts");
  } catch (const Error& e) {
    log_info(str("warning: ", e.what(), "; the verdict holds for this run only"));
  }
}

}  // namespace spotrain
