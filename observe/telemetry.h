// What the machine is doing while a run trains: the GPU through NVML (opened at run time, so a
// machine without a GPU or without the driver records null and never fails) and the host
// from /proc (CPU use, resident memory, bytes read from storage, i.e. page-cache misses).
// Sampled with each progress line into the metrics, and by `bench`.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace spotrain {

class Telemetry {
 public:
  // pci_bus_id: the GPU this rank trains on ("" = none: the GPU field is null).
  explicit Telemetry(const std::string& pci_bus_id);
  // {"gpu": {...} | null, "host": {...}} (one type or null, never a string in its place); rates and shares cover the time since the
  // previous sample (or since construction).
  nlohmann::json sample();
  // The GPU's SM utilisation (percent) at the latest sample, when known.
  std::optional<double> sm_util() const { return sm_util_; }
  // Why the GPU field is null ("" when it is not).
  const std::string& gpu_status() const { return gpu_status_; }

 private:
  nlohmann::json gpu();
  nlohmann::json host();
  void* device_ = nullptr;  // nvmlDevice_t
  std::string gpu_status_;
  nlohmann::json gpu_id_ = nlohmann::json::object();  // index, uuid, pci_bus_id: DCGM's labels
  std::optional<double> sm_util_;
  // The previous sample's counters, for rates.
  double t_ = 0, proc_cpu_s_ = 0;
  long long sys_busy_ = -1, sys_total_ = -1, storage_read_ = -1;
};

}  // namespace spotrain
