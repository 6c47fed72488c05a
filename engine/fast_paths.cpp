// FastPathChecks (see fast_paths.h).
#include "engine/fast_paths.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
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

double update_difference(const std::vector<float>& before, const std::vector<float>& want,
                         const std::vector<float>& got) {
  if (got.size() != want.size() || before.size() != want.size()) return INFINITY;
  double d = 0, u = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isfinite(want[i]) && !std::isfinite(got[i])) return INFINITY;
    const float w = std::fabs(want[i]);
    const double ulp = double(std::nextafter(w, INFINITY)) - w;
    const double excess = std::max(0.0, std::fabs(double(got[i]) - want[i]) - ulp);
    d += excess * excess;
    u += (double(want[i]) - before[i]) * (double(want[i]) - before[i]);
  }
  if (d == 0) return 0;
  return std::sqrt(d) / std::max(std::sqrt(u), 1e-30);
}

std::string fast_path_device(const std::string& host, const std::string& gpu_uuid,
                             const std::string& pci_bus_id, const std::string& info) {
  if (gpu_uuid.empty()) return str("host ", host, ": ", info);
  return str("host ", host, ", ", gpu_uuid, " at PCI ", pci_bus_id, ": ", info);
}

namespace {

// The file's verdicts ({"devices": {device: {path: difference}}}); an empty document where
// the file does not exist. Throws Error where it exists but cannot be read or parsed.
nlohmann::json read_verdicts(const std::string& path) {
  const std::optional<std::string> text = read_file_if_any(path);
  if (!text) return nlohmann::json::object();
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  SPOTRAIN_CHECK(!j.is_discarded(), "is not JSON");
  SPOTRAIN_CHECK(j.is_object() && j.contains("devices") && j["devices"].is_object(),
                 "has no \"devices\" object");
  return j;
}

}  // namespace

FastPathChecks::FastPathChecks(std::string path, std::string device)
    : path_(std::move(path)), device_(std::move(device)) {
  if (path_.empty()) return;
  try {
    const nlohmann::json j = read_verdicts(path_);
    if (!j.contains("devices")) return;  // none yet
    const auto dev = j["devices"].find(device_);
    if (dev == j["devices"].end() || !dev->is_object()) return;
    for (auto it = dev->begin(); it != dev->end(); ++it)
      if (it.value().is_string()) off_[it.key()] = it.value().get<std::string>();
  } catch (const std::exception& e) {
    log_info(str("warning: ", path_, " cannot be read (", e.what(),
                 "); the fast paths are checked again and the file rewritten"));
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
  try {
    // Merged into the file as it is now, not as it was read at the start: other ranks (this
    // host's, or every host's on shared storage) may have written theirs since.
    FileLock lock(path_);
    nlohmann::json j;
    try {
      j = read_verdicts(path_);
    } catch (const std::exception&) {
      j = nlohmann::json::object();  // unreadable: replaced (the start warned)
    }
    if (!j.contains("devices")) j = {{"devices", nlohmann::json::object()}};
    nlohmann::json& mine = j["devices"][device_];
    if (!mine.is_object()) mine = nlohmann::json::object();
    // Added to: another rank on this device (ranks sharing a GPU) keeps its verdicts.
    for (const auto& [k, v] : off_) mine[k] = v;
    write_file_atomic(path_, j.dump(2) + "\n", "the fast paths' verdicts");
  } catch (const std::exception& e) {
    log_info(str("warning: ", e.what(), "; the verdict holds for this run only"));
  }
}

}  // namespace spotrain
