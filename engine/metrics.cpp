// MetricsSink (see metrics.h).
#include "engine/metrics.h"

#include <cerrno>
#include <cstring>

#include "engine/core/error.h"

namespace spotrain {

MetricsSink::MetricsSink(const std::string& path, bool enabled) {
  if (path.empty() || !enabled) return;
  f_ = std::fopen(path.c_str(), "w");
  SPOTRAIN_CHECK(f_, "cannot write metrics file ", path, ": ", std::strerror(errno));
}

MetricsSink::~MetricsSink() {
  if (f_) std::fclose(f_);
}

void MetricsSink::write(const char* type, nlohmann::json fields) {
  if (!f_) return;
  nlohmann::json j{{"type", type}};
  j.update(fields);
  std::fprintf(f_, "%s\n", j.dump().c_str());
  std::fflush(f_);
}

}  // namespace spotrain
