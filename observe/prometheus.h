// --prometheus FILE: the run's latest figures in Prometheus' text exposition format, for
// node-exporter's text-file collector (it reads *.prom files from one folder). The file is
// written whole to a temporary name beside it and renamed over the old one, so the exporter
// never reads half a file.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace spotrain {

struct PromSample {
  std::string name;    // e.g. "spotrain_step"; a sample family shares a name
  std::string help;    // one line
  std::string type;    // "gauge" or "counter"
  std::string labels;  // extra labels without braces, e.g. gpu="0" ("" = none)
  double value = 0;
};

class PrometheusFile {
 public:
  // labels: added to every sample, e.g. run="resnet50-a",rank="0".
  PrometheusFile(std::string path, std::string labels);
  // Replaces the file with these samples. Throws Error when the folder cannot be written.
  void write(const std::vector<PromSample>& samples) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_, labels_;
};

// The samples for one progress record of the metrics (metrics.h's "step" record, with its
// "gpu" and "host" telemetry): step, epoch, loss, images/s, data-wait share, memory, GPU and
// host fields that are present.
std::vector<PromSample> prom_samples_of_record(const nlohmann::json& record);

// A label value with the characters the format escapes (\, ", newline) escaped.
std::string prom_escape(const std::string& v);

// A run's --prometheus file, kept by the first rank of each node: every progress record's
// figures (Progress hands them over as it writes them), whether the run still trains, when
// the file was written, and on rank 0 the run's restarts and the newest checkpoint's age. A
// file that cannot be written is warned about once and given up: monitoring never stops
// training.
class PrometheusExport {
 public:
  // labels: as PrometheusFile's; restarts: the processes this run had before this one (rank
  // 0's figure, < 0 on other ranks: not exported there).
  PrometheusExport(std::string path, std::string labels, int64_t restarts);
  // A progress record (metrics.h's "step" record).
  void progress(const nlohmann::json& record);
  // A checkpoint begun (written = false: in the background) or known to be written.
  void checkpoint(const std::string& path, bool written);
  // The run stopped or ended: the last figures, with spotrain_running 0.
  void finished();

 private:
  void publish(bool running);
  std::unique_ptr<PrometheusFile> file_;
  int64_t restarts_;
  nlohmann::json last_;                   // the latest progress record
  std::string ckpt_started_, ckpt_done_;  // newest checkpoint begun, and known written
};

}  // namespace spotrain
