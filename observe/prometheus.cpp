// PrometheusFile (see prometheus.h).
#include "observe/prometheus.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <set>

#include "core/atomic_file.h"
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
  std::string labels;  // on the GPU's series: DCGM exporter's gpu and UUID labels, to join on
  auto add = [&](const nlohmann::json& obj, const char* key, const char* name, const char* help,
                 double scale = 1.0) {
    if (obj.is_object() && obj.contains(key) && obj[key].is_number())
      out.push_back({name, help, "gauge", labels, obj[key].get<double>() * scale});
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
  if (g.is_object()) {
    if (g.contains("index") && g["index"].is_number_integer())
      labels = "gpu=\"" + std::to_string(g["index"].get<int64_t>()) + "\"";
    for (const auto& [key, label] : {std::pair{"uuid", "UUID"}, std::pair{"pci_bus_id", "pci_bus_id"}})
      if (g.contains(key) && g[key].is_string())
        labels += std::string(labels.empty() ? "" : ",") + label + "=\"" + prom_escape(g[key].get<std::string>()) + "\"";
  }
  add(g, "sm_util", "spotrain_gpu_sm_utilization_ratio", "GPU SM utilisation", 0.01);
  add(g, "memory_used_bytes", "spotrain_gpu_memory_used_bytes", "GPU memory in use");
  add(g, "memory_total_bytes", "spotrain_gpu_memory_total_bytes", "GPU memory");
  add(g, "power_w", "spotrain_gpu_power_watts", "GPU power draw");
  add(g, "temperature_c", "spotrain_gpu_temperature_celsius", "GPU temperature");
  add(g, "sm_clock_mhz", "spotrain_gpu_sm_clock_hertz", "GPU SM clock", 1e6);
  add(g, "pcie_tx_kbps", "spotrain_gpu_pcie_tx_bytes_per_second", "PCIe bytes/s sent by the GPU", 1e3);
  add(g, "pcie_rx_kbps", "spotrain_gpu_pcie_rx_bytes_per_second", "PCIe bytes/s received by the GPU", 1e3);
  labels.clear();
  const nlohmann::json& h = r.contains("host") ? r["host"] : nlohmann::json();
  add(h, "process_cpu_cores", "spotrain_process_cpu_cores", "CPU cores the process kept busy");
  add(h, "machine_cpu_util", "spotrain_machine_cpu_utilization_ratio", "busy share of all cores", 0.01);
  add(h, "rss_bytes", "spotrain_process_resident_bytes", "resident memory of the process");
  add(h, "storage_read_mb_s", "spotrain_storage_read_bytes_per_second",
      "bytes/s read from storage (page-cache misses)", 1e6);
  // Each rank's own times over the window and whether it is a straggler (several ranks): the
  // series carry the rank they describe as of_rank and its host, beside the file's own labels.
  if (r.contains("ranks") && r["ranks"].is_array()) {
    std::set<int64_t> named;
    if (r.contains("stragglers") && r["stragglers"].is_array())
      for (const nlohmann::json& s : r["stragglers"])
        if (s.contains("rank") && s["rank"].is_number_integer()) named.insert(s["rank"].get<int64_t>());
    // One family at a time: the format wants a family's samples together.
    const char* families[][3] = {
        {"compute_s", "spotrain_rank_compute_seconds", "a rank's compute per step over the window (without its waits)"},
        {"input_s", "spotrain_rank_input_seconds", "a rank's wait for its batch per step over the window"},
        {"wait_s", "spotrain_rank_wait_seconds", "a rank's wait for the other ranks' gradients per step"},
        {"", "spotrain_rank_straggler", "1 when the rank is named a straggler in the window"}};
    for (const auto& f : families) {
      for (const nlohmann::json& k : r["ranks"]) {
        if (!k.is_object() || !k.contains("rank") || !k["rank"].is_number_integer()) continue;
        const int64_t rank = k["rank"].get<int64_t>();
        labels = str("of_rank=\"", rank, "\",host=\"", prom_escape(k.value("host", std::string())), "\"");
        if (*f[0])
          add(k, f[0], f[1], f[2]);
        else
          out.push_back({f[1], f[2], "gauge", labels, named.count(rank) ? 1.0 : 0.0});
      }
    }
    labels.clear();
  }
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
  // Rewritten at every progress line and read only while the run lives: a rename keeps
  // readers off half a file, and no fsync is paid for a figure the next line replaces.
  write_file_atomic(path_, text, "the --prometheus file", Durability::visible);
}

PrometheusExport::PrometheusExport(std::string path, std::string labels, int64_t restarts)
    : file_(std::make_unique<PrometheusFile>(std::move(path), std::move(labels))), restarts_(restarts) {}

void PrometheusExport::progress(const nlohmann::json& record) {
  last_ = record;
  publish(true);
}

void PrometheusExport::checkpoint(const std::string& path, bool written) {
  ckpt_started_ = path;
  if (written) ckpt_done_ = path;
}

void PrometheusExport::finished() { publish(false); }

void PrometheusExport::publish(bool running) {
  if (!file_ || !last_.is_object()) return;
  std::vector<PromSample> s = prom_samples_of_record(last_);
  s.push_back({"spotrain_running", "1 while the run trains, 0 once it has stopped or ended", "gauge",
               "", running ? 1.0 : 0.0});
  s.push_back({"spotrain_last_update_timestamp_seconds",
               "when this file was written (a stale file: the run is gone)", "gauge", "",
               double(std::time(nullptr))});
  if (restarts_ >= 0) {
    // A count that only grows: a counter, named *_total as Prometheus's conventions ask.
    s.push_back({"spotrain_restarts_total", "processes this run was restarted in (resumes)", "counter", "",
                 double(restarts_)});
    // A background write is known done once its file exists (it is renamed into place).
    struct stat st {};
    if (!ckpt_started_.empty() && ::stat(ckpt_started_.c_str(), &st) == 0) ckpt_done_ = ckpt_started_;
    if (!ckpt_done_.empty() && ::stat(ckpt_done_.c_str(), &st) == 0) {
      // The timestamp stays true after the process is gone (an age freezes with the file).
      s.push_back({"spotrain_last_checkpoint_timestamp_seconds", "when the newest checkpoint was written",
                   "gauge", "", double(st.st_mtime)});
      s.push_back({"spotrain_last_checkpoint_age_seconds", "seconds since the newest checkpoint was written",
                   "gauge", "", double(std::time(nullptr) - st.st_mtime)});
    }
  }
  try {
    file_->write(s);
  } catch (const std::exception& e) {  // a monitoring file never stops training
    std::fprintf(stderr, "warning: %s; --prometheus is off for the rest of this run\n", e.what());
    file_.reset();
  }
}

}  // namespace spotrain
