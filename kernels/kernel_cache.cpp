// KernelCache (see kernel_cache.h). The file:
//   {"format": "spotrain kernel choices 1",
//    "devices": {"<device>": {"<op and shape>": {"choice": ..., "ms": ..., "runner_up": ...,
//                                               "runner_up_ms": ...}, ...}, ...}}
#include "kernels/kernel_cache.h"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"

namespace spotrain {

namespace {

constexpr const char* kFormat = "spotrain kernel choices 1";

// The file's JSON; an empty document where it does not exist. Throws Error on a file that
// exists but cannot be read or is not a cache of this format.
nlohmann::json read_cache(const std::string& path) {
  const std::optional<std::string> text = read_file_if_any(path);
  if (!text) return nlohmann::json::object();
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  SPOTRAIN_CHECK(!j.is_discarded(), "is not JSON");
  SPOTRAIN_CHECK(j.is_object() && j.contains("format") && j["format"].is_string() &&
                     j["format"].get<std::string>() == kFormat && j.contains("devices") &&
                     j["devices"].is_object(),
                 "is not a kernel cache of this version (format '", kFormat, "')");
  return j;
}

bool verdict_of(const nlohmann::json& v, TuneVerdict& out) {
  if (!v.is_object() || !v.contains("choice") || !v["choice"].is_string()) return false;
  auto number = [&](const char* k) { return v.contains(k) && v[k].is_number() ? v[k].get<double>() : 0.0; };
  out.choice = v["choice"].get<std::string>();
  out.ms = number("ms");
  out.runner_up = v.contains("runner_up") && v["runner_up"].is_string() ? v["runner_up"].get<std::string>() : "";
  out.runner_up_ms = number("runner_up_ms");
  return true;
}

nlohmann::json json_of(const TuneVerdict& v) {
  nlohmann::json j = {{"choice", v.choice}, {"ms", v.ms}};
  if (!v.runner_up.empty()) {
    j["runner_up"] = v.runner_up;
    j["runner_up_ms"] = v.runner_up_ms;
  }
  return j;
}

}  // namespace

std::string TuneVerdict::times() const {
  return str(fmt_fixed(ms, 3), " ms",
             runner_up.empty() ? std::string() : str(", runner-up ", runner_up, " ", fmt_fixed(runner_up_ms, 3), " ms"));
}

KernelCache::KernelCache(std::string path, std::string device)
    : path_(std::move(path)), device_(std::move(device)) {
  if (path_.empty()) return;
  try {
    nlohmann::json j = read_cache(path_);
    if (!j.contains("devices")) return;
    auto it = j["devices"].find(device_);
    if (it == j["devices"].end() || !it->is_object()) return;
    for (auto& [key, v] : it->items()) {
      TuneVerdict t;
      if (verdict_of(v, t)) mine_[key] = std::move(t);
    }
    loaded_ = mine_.size();
  } catch (const std::exception& e) {
    load_problem_ = e.what();
    log_info(str("warning: the kernel cache ", path_, " ", e.what(),
                 ": the kernels are timed again and the file rewritten"));
  }
}

const TuneVerdict* KernelCache::find(const std::string& key) const {
  auto it = mine_.find(key);
  return it == mine_.end() ? nullptr : &it->second;
}

void KernelCache::put(const std::string& key, TuneVerdict v) {
  mine_[key] = v;
  pending_[key] = std::move(v);
}

bool KernelCache::save() {
  if (path_.empty() || pending_.empty()) return false;
  try {
    const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    FileLock lock(path_);
    nlohmann::json j;
    try {
      j = read_cache(path_);
    } catch (const std::exception&) {
      j = nlohmann::json::object();  // unreadable or foreign: replaced (the load warned)
    }
    if (!j.contains("devices")) j = {{"format", kFormat}, {"devices", nlohmann::json::object()}};
    nlohmann::json& mine = j["devices"][device_];
    if (!mine.is_object()) mine = nlohmann::json::object();
    for (const auto& [key, v] : pending_) mine[key] = json_of(v);
    write_file_atomic(path_, j.dump(1) + "\n", "the kernel cache", Durability::visible);
    pending_.clear();
    return true;
  } catch (const std::exception& e) {
    if (!warned_)
      log_info(str("warning: the kernel cache ", path_, " could not be written (", e.what(),
                   "): a restart times the kernels again"));
    warned_ = true;
    pending_.clear();  // said once; not tried again at every step
    return false;
  }
}

std::string KernelCache::resolve_path(const std::string& setting, const std::string& run_folder) {
  if (setting == "none") return "";
  if (setting != "auto") return setting;
  if (!run_folder.empty()) return (std::filesystem::path(run_folder) / "kernel-cache.json").string();
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return (std::filesystem::path(xdg) / "spotrain" / "kernel-cache.json").string();
  if (const char* home = std::getenv("HOME"); home && *home)
    return (std::filesystem::path(home) / ".cache" / "spotrain" / "kernel-cache.json").string();
  return "";
}

}  // namespace spotrain
