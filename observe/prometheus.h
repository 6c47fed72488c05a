// --prometheus FILE: the run's latest figures in Prometheus' text exposition format, for
// node-exporter's text-file collector (it reads *.prom files from one folder). The file is
// written whole to a temporary name beside it and renamed over the old one, so the exporter
// never reads half a file.
#pragma once
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

}  // namespace spotrain
