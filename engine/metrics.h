// The JSONL metrics file (--metrics FILE), written by rank 0: a start record saying where and
// how the run ran (backend, ranks, machine, every setting), one record per progress line and
// one per evaluated epoch. Each line is flushed as written.
#pragma once
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace spotrain {

class MetricsSink {
 public:
  // path "" or enabled = false: a sink that writes nothing.
  MetricsSink(const std::string& path, bool enabled);
  ~MetricsSink();
  MetricsSink(const MetricsSink&) = delete;
  MetricsSink& operator=(const MetricsSink&) = delete;
  bool enabled() const { return f_ != nullptr; }
  // Writes one record with "type": type and the given fields.
  void write(const char* type, nlohmann::json fields);

 private:
  FILE* f_ = nullptr;
};

}  // namespace spotrain
