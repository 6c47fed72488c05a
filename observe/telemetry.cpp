// Telemetry (see telemetry.h). NVML's C API is declared here (a handful of calls, stable ABI),
// so builds without the CUDA toolkit sample the GPU too.
#include "observe/telemetry.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/clock.h"
#include "core/dynlib.h"

namespace spotrain {

namespace {

using nvmlDevice = void*;
struct NvmlUtilization {
  unsigned gpu, memory;  // percent of the sample period busy
};
struct NvmlMemory {
  unsigned long long total, free, used;
};
constexpr int kNvmlSuccess = 0;
constexpr int kTemperatureGpu = 0;
constexpr int kClockSm = 1, kClockMem = 2;
constexpr int kPcieTx = 0, kPcieRx = 1;

DynLib& nvml() { return nvml_library(); }

template <class F>
F* nvml_fn(const char* name) {
  return nvml().available() ? reinterpret_cast<F*>(nvml().require(name)) : nullptr;
}

// The first line of a /proc file holding "key value" pairs, or its whole text.
std::string read_text(const char* path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

long long field_of(const std::string& text, const char* key) {  // "key: 123" or "key 123"
  size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  return std::atoll(text.c_str() + at + std::strlen(key));
}

}  // namespace

Telemetry::Telemetry(const std::string& pci_bus_id) : t_(now_seconds()) {
  if (pci_bus_id.empty()) {
    gpu_status_ = "no GPU in use";
  } else if (!nvml().available()) {
    gpu_status_ = "NVML not available: " + nvml().load_error();
  } else {
    try {
      auto init = nvml_fn<int()>("nvmlInit_v2");
      auto by_bus = nvml_fn<int(const char*, nvmlDevice*)>("nvmlDeviceGetHandleByPciBusId_v2");
      if (init() != kNvmlSuccess)
        gpu_status_ = "nvmlInit failed";
      else if (by_bus(pci_bus_id.c_str(), &device_) != kNvmlSuccess)
        gpu_status_ = "NVML does not know the GPU at " + pci_bus_id;
    } catch (const std::exception& e) {  // a driver too old for a call: no GPU fields
      gpu_status_ = e.what();
      device_ = nullptr;
    }
  }
  if (!gpu_status_.empty()) device_ = nullptr;
  if (device_) {  // which GPU: what DCGM's exporter labels its series with, to join on
    gpu_id_["pci_bus_id"] = pci_bus_id;
    unsigned index = 0;
    if (auto f = nvml_fn<int(nvmlDevice, unsigned*)>("nvmlDeviceGetIndex"); f && f(device_, &index) == kNvmlSuccess)
      gpu_id_["index"] = index;
    char uuid[96] = {};
    if (auto f = nvml_fn<int(nvmlDevice, char*, unsigned)>("nvmlDeviceGetUUID");
        f && f(device_, uuid, sizeof uuid) == kNvmlSuccess)
      gpu_id_["uuid"] = std::string(uuid);
  }
  host();  // the counters' starting values
}

nlohmann::json Telemetry::gpu() {
  sm_util_.reset();
  if (!device_) return nullptr;
  nlohmann::json g = gpu_id_;
  auto get_u = [&](const char* key, auto fn, auto... args) {
    unsigned v = 0;
    if (fn && fn(device_, args..., &v) == kNvmlSuccess) g[key] = v;
  };
  NvmlUtilization u{};
  if (auto f = nvml_fn<int(nvmlDevice, NvmlUtilization*)>("nvmlDeviceGetUtilizationRates");
      f && f(device_, &u) == kNvmlSuccess) {
    g["sm_util"] = u.gpu;
    g["mem_util"] = u.memory;
    sm_util_ = double(u.gpu);
  }
  NvmlMemory m{};
  if (auto f = nvml_fn<int(nvmlDevice, NvmlMemory*)>("nvmlDeviceGetMemoryInfo");
      f && f(device_, &m) == kNvmlSuccess) {
    g["memory_used_bytes"] = m.used;
    g["memory_total_bytes"] = m.total;
  }
  unsigned mw = 0;
  if (auto f = nvml_fn<int(nvmlDevice, unsigned*)>("nvmlDeviceGetPowerUsage"); f && f(device_, &mw) == kNvmlSuccess)
    g["power_w"] = double(mw) / 1000.0;
  get_u("temperature_c", nvml_fn<int(nvmlDevice, int, unsigned*)>("nvmlDeviceGetTemperature"), kTemperatureGpu);
  get_u("sm_clock_mhz", nvml_fn<int(nvmlDevice, int, unsigned*)>("nvmlDeviceGetClockInfo"), kClockSm);
  get_u("mem_clock_mhz", nvml_fn<int(nvmlDevice, int, unsigned*)>("nvmlDeviceGetClockInfo"), kClockMem);
  // PCIe throughput in KB/s over the driver's last 20 ms window.
  get_u("pcie_tx_kbps", nvml_fn<int(nvmlDevice, int, unsigned*)>("nvmlDeviceGetPcieThroughput"), kPcieTx);
  get_u("pcie_rx_kbps", nvml_fn<int(nvmlDevice, int, unsigned*)>("nvmlDeviceGetPcieThroughput"), kPcieRx);
  return g;
}

nlohmann::json Telemetry::host() {
  nlohmann::json h = nlohmann::json::object();
  const double t = now_seconds(), dt = t - t_;
  t_ = t;
  static const double ticks = double(sysconf(_SC_CLK_TCK));
  // This process: user + system time of all its threads (fields 14, 15 of /proc/self/stat).
  std::string stat = read_text("/proc/self/stat");
  size_t close = stat.rfind(')');
  if (close != std::string::npos) {
    std::istringstream in(stat.substr(close + 2));
    std::string f;
    unsigned long long ut = 0, st = 0;
    for (int i = 3; i <= 15 && in >> f; ++i) {
      if (i == 14) ut = std::stoull(f);
      if (i == 15) st = std::stoull(f);
    }
    const double cpu_s = double(ut + st) / ticks;
    if (dt > 0 && proc_cpu_s_ > 0) h["process_cpu_cores"] = (cpu_s - proc_cpu_s_) / dt;
    proc_cpu_s_ = cpu_s;
  }
  // The whole machine: busy share of all cores (/proc/stat's first line).
  std::istringstream cpu(read_text("/proc/stat"));
  std::string name;
  long long v, total = 0, idle = 0;
  cpu >> name;
  for (int i = 0; i < 8 && cpu >> v; ++i) {
    total += v;
    if (i == 3 || i == 4) idle += v;  // idle, iowait
  }
  if (name == "cpu" && total > 0) {
    if (sys_total_ >= 0 && total > sys_total_)
      h["machine_cpu_util"] = 100.0 * double((total - idle) - sys_busy_) / double(total - sys_total_);
    sys_total_ = total;
    sys_busy_ = total - idle;
  }
  h["cores"] = long(sysconf(_SC_NPROCESSORS_ONLN));
  const long long rss_kb = field_of(read_text("/proc/self/status"), "VmRSS:");
  if (rss_kb >= 0) h["rss_bytes"] = rss_kb * 1024;
  // Bytes this process caused to be fetched from storage: its reads the page cache missed.
  const long long storage = field_of(read_text("/proc/self/io"), "read_bytes:");
  if (storage >= 0) {
    if (storage_read_ >= 0 && dt > 0) h["storage_read_mb_s"] = double(storage - storage_read_) / dt / 1e6;
    storage_read_ = storage;
  }
  return h;
}

nlohmann::json Telemetry::sample() {
  nlohmann::json j{{"gpu", gpu()}, {"host", host()}};
  if (!gpu_status_.empty()) j["gpu_status"] = gpu_status_;
  return j;
}

}  // namespace spotrain
