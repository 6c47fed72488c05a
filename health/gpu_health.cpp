// check_gpu_health (see gpu_health.h). NVML's calls and constants as its header (nvml.h)
// declares them: a handful of stable C entry points, declared here.
#include "health/gpu_health.h"

#include "core/dynlib.h"
#include "core/error.h"

namespace spotrain::health {

namespace {

using nvmlDevice = void*;
constexpr int kNvmlSuccess = 0;
constexpr int kMemoryErrorUncorrected = 1;  // NVML_MEMORY_ERROR_TYPE_UNCORRECTED
constexpr int kVolatileEcc = 0, kAggregateEcc = 1;
// nvmlClocksEventReason* (formerly nvmlClocksThrottleReason*) bits
constexpr unsigned long long kSwPowerCap = 0x4, kHwSlowdown = 0x8, kSwThermal = 0x20,
                             kHwThermal = 0x40, kHwPowerBrake = 0x80;

template <class F>
F* fn(const char* name) {
  DynLib& lib = nvml_library();
  if (!lib.available()) return nullptr;
  try {
    return reinterpret_cast<F*>(lib.require(name));
  } catch (const std::exception&) {
    return nullptr;  // a driver too old for the call
  }
}

// The device at pci_bus_id, or null with `why`.
nvmlDevice open_device(const std::string& pci_bus_id, std::string& why) {
  if (!nvml_library().available()) {
    why = "NVML not available: " + nvml_library().load_error();
    return nullptr;
  }
  auto init = fn<int()>("nvmlInit_v2");
  auto by_bus = fn<int(const char*, nvmlDevice*)>("nvmlDeviceGetHandleByPciBusId_v2");
  nvmlDevice d = nullptr;
  if (!init || init() != kNvmlSuccess) why = "nvmlInit failed";
  else if (!by_bus || by_bus(pci_bus_id.c_str(), &d) != kNvmlSuccess) why = "NVML does not know the GPU at " + pci_bus_id;
  return why.empty() ? d : nullptr;
}

}  // namespace

void check_gpu_health(const std::string& pci_bus_id, const GpuFinding& out) {
  std::string why;
  nvmlDevice d = open_device(pci_bus_id, why);
  if (!d) {
    out("gpu health", 1, why, "ECC, retired pages and clocks unchecked");
    return;
  }
  if (auto ecc = fn<int(nvmlDevice, int, int, unsigned long long*)>("nvmlDeviceGetTotalEccErrors")) {
    unsigned long long now = 0, ever = 0;
    const bool a = ecc(d, kMemoryErrorUncorrected, kVolatileEcc, &now) == kNvmlSuccess;
    const bool b = ecc(d, kMemoryErrorUncorrected, kAggregateEcc, &ever) == kNvmlSuccess;
    if (!a && !b) out("gpu ecc", 0, "ECC off or not reported on this GPU", "");
    else
      out("gpu ecc", now > 0 ? 2 : ever > 0 ? 1 : 0,
          str(now, " uncorrected ECC errors since the driver loaded, ", ever, " in the GPU's life"),
          "fail on any since the driver loaded; warn on any before");
  }
  if (auto pending = fn<int(nvmlDevice, int*)>("nvmlDeviceGetRetiredPagesPendingStatus")) {
    int p = 0;
    if (pending(d, &p) == kNvmlSuccess)
      out("gpu retired pages", p ? 2 : 0, p ? "pages wait for retirement (a GPU reset is due)" : "none pending",
          "fail when pages wait for a reset");
  }
  if (auto rows = fn<int(nvmlDevice, unsigned*, unsigned*, unsigned*, unsigned*)>("nvmlDeviceGetRemappedRows")) {
    unsigned corr = 0, unc = 0, pending = 0, failed = 0;
    if (rows(d, &corr, &unc, &pending, &failed) == kNvmlSuccess)
      out("gpu remapped rows", failed || pending ? 2 : 0,
          str(corr, " rows remapped for correctable and ", unc, " for uncorrectable errors",
              pending ? ", a remapping waits for a reset" : "", failed ? ", a remapping failed" : ""),
          "fail when a remapping waits or failed");
  }
}

void check_gpu_health_under_load(const std::string& pci_bus_id, const GpuFinding& out) {
  std::string why;
  nvmlDevice d = open_device(pci_bus_id, why);
  if (!d) return;  // said by check_gpu_health
  auto reasons = fn<int(nvmlDevice, unsigned long long*)>("nvmlDeviceGetCurrentClocksEventReasons");
  if (!reasons) reasons = fn<int(nvmlDevice, unsigned long long*)>("nvmlDeviceGetCurrentClocksThrottleReasons");
  unsigned long long r = 0;
  if (reasons && reasons(d, &r) == kNvmlSuccess) {
    std::string held;
    auto say = [&](unsigned long long bit, const char* what) {
      if (r & bit) held += (held.empty() ? "" : ", ") + std::string(what);
    };
    say(kHwThermal, "hardware thermal slowdown");
    say(kSwThermal, "software thermal slowdown");
    say(kHwPowerBrake, "power brake");
    say(kHwSlowdown, "hardware slowdown");
    say(kSwPowerCap, "power cap");
    const bool bad = r & (kHwThermal | kSwThermal | kHwPowerBrake | kHwSlowdown);
    out("gpu clocks", bad ? 2 : (r & kSwPowerCap) ? 1 : 0,
        held.empty() ? "not held down" : "held down by " + held,
        "fail on thermal or hardware slowdown, warn at the power cap");
  }
  auto cur_gen = fn<int(nvmlDevice, unsigned*)>("nvmlDeviceGetCurrPcieLinkGeneration");
  auto max_gen = fn<int(nvmlDevice, unsigned*)>("nvmlDeviceGetMaxPcieLinkGeneration");
  auto cur_w = fn<int(nvmlDevice, unsigned*)>("nvmlDeviceGetCurrPcieLinkWidth");
  auto max_w = fn<int(nvmlDevice, unsigned*)>("nvmlDeviceGetMaxPcieLinkWidth");
  unsigned g = 0, gm = 0, w = 0, wm = 0;
  if (cur_gen && max_gen && cur_w && max_w && cur_gen(d, &g) == kNvmlSuccess &&
      max_gen(d, &gm) == kNvmlSuccess && cur_w(d, &w) == kNvmlSuccess && max_w(d, &wm) == kNvmlSuccess)
    out("gpu pcie", w < wm ? 2 : g < gm ? 1 : 0, str("gen ", g, " x", w),
        str("the most this GPU and slot run: gen ", gm, " x", wm,
            "; fail on a narrower link, warn on an older generation"));
}

}  // namespace spotrain::health
