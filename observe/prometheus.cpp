// PrometheusFile (see prometheus.h).
#include "observe/prometheus.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "core/error.h"

namespace spotrain {

std::string prom_escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::vector<PromSample> prom_samples_of_record(const nlohmann::json& r) {
  std::vector<PromSample> out;
  auto add = [&](const nlohmann::json& obj, const char* key, const char* name, const char* help,
                 double scale = 1.0) {
    if (obj.is_object() && obj.contains(key) && obj[key].is_number())
      out.push_back({name, help, "gauge", "", obj[key].get<double>() * scale});
  };
  add(r, "step", "spotrain_step", "training steps done");
  add(r, "epoch", "spotrain_epoch", "epoch in progress (1-based)");
  add(r, "loss", "spotrain_loss", "mean training loss over the latest progress window");
  add(r, "train_top1", "spotrain_train_top1_ratio", "training top-1 accuracy over the latest window");
  add(r, "lr", "spotrain_learning_rate", "learning rate");
  add(r, "images_per_sec", "spotrain_images_per_second", "images per second, all ranks");
  add(r, "step_seconds", "spotrain_step_seconds", "mean seconds per step over the latest window");
  add(r, "data_wait_share", "spotrain_data_wait_ratio", "share of the step time spent waiting for data");
  add(r, "memory_bytes", "spotrain_device_memory_peak_bytes", "peak tensor memory of the compute device");
  add(r, "loss_scale", "spotrain_loss_scale", "fp16 dynamic loss scale");
  const nlohmann::json& g = r.contains("gpu") ? r["gpu"] : nlohmann::json();
  add(g, "sm_util", "spotrain_gpu_sm_utilization_ratio", "GPU SM utilisation", 0.01);
  add(g, "memory_used_bytes", "spotrain_gpu_memory_used_bytes", "GPU memory in use");
  add(g, "memory_total_bytes", "spotrain_gpu_memory_total_bytes", "GPU memory");
  add(g, "power_w", "spotrain_gpu_power_watts", "GPU power draw");
  add(g, "temperature_c", "spotrain_gpu_temperature_celsius", "GPU temperature");
  add(g, "sm_clock_mhz", "spotrain_gpu_sm_clock_hertz", "GPU SM clock", 1e6);
  add(g, "pcie_tx_kbps", "spotrain_gpu_pcie_tx_bytes_per_second", "PCIe bytes/s sent by the GPU", 1e3);
  add(g, "pcie_rx_kbps", "spotrain_gpu_pcie_rx_bytes_per_second", "PCIe bytes/s received by the GPU", 1e3);
  const nlohmann::json& h = r.contains("host") ? r["host"] : nlohmann::json();
  add(h, "process_cpu_cores", "spotrain_process_cpu_cores", "CPU cores the process kept busy");
  add(h, "machine_cpu_util", "spotrain_machine_cpu_utilization_ratio", "busy share of all cores", 0.01);
  add(h, "rss_bytes", "spotrain_process_resident_bytes", "resident memory of the process");
  add(h, "storage_read_mb_s", "spotrain_storage_read_bytes_per_second",
      "bytes/s read from storage (page-cache misses)", 1e6);
  return out;
}

PrometheusFile::PrometheusFile(std::string path, std::string labels)
    : path_(std::move(path)), labels_(std::move(labels)) {}

void PrometheusFile::write(const std::vector<PromSample>& samples) const {
  std::string text;
  std::set<std::string> described;
  for (const PromSample& s : samples) {
    if (described.insert(s.name).second)
      text += "# HELP " + s.name + " " + s.help + "\n# TYPE " + s.name + " " + s.type + "\n";
    std::string labels = labels_;
    if (!s.labels.empty()) labels += (labels.empty() ? "" : ",") + s.labels;
    char value[64];
    if (std::isnan(s.value))
      std::snprintf(value, sizeof value, "NaN");
    else if (std::isinf(s.value))
      std::snprintf(value, sizeof value, s.value > 0 ? "+Inf" : "-Inf");
    else
      std::snprintf(value, sizeof value, "%.17g", s.value);
    text += s.name + (labels.empty() ? "" : "{" + labels + "}") + " " + value + "\n";
  }
  const std::string tmp = path_ + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  SPOTRAIN_CHECK(f, "cannot write the --prometheus file ", tmp, ": ", std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    std::remove(tmp.c_str());
    SPOTRAIN_THROW("cannot write the --prometheus file ", tmp, ": ", std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    std::remove(tmp.c_str());
    SPOTRAIN_THROW("cannot replace the --prometheus file ", path_, ": ", std::strerror(errno));
  }
}

}  // namespace spotrain
