// MetricsSink (see metrics.h).
#include "engine/metrics.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "engine/core/clock.h"
#include "engine/core/error.h"

namespace spotrain {

MetricsSink::MetricsSink(const std::string& path, bool enabled) : started_(now_seconds()) {
  if (path.empty() || !enabled) return;
  {  // what the file ends with: a resume record says how the previous process ended
    std::ifstream in(path);
    std::string line, last;
    while (std::getline(in, line))
      if (!line.empty()) last = line;
    if (!last.empty()) previous_last_ = nlohmann::json::parse(last, nullptr, false);
    if (previous_last_.is_discarded()) previous_last_ = nullptr;  // a torn last line
  }
  f_ = std::fopen(path.c_str(), "a+");
  SPOTRAIN_CHECK(f_, "cannot write metrics file ", path, ": ", std::strerror(errno));
  // A process killed mid-line left a torn record: start on a line of our own.
  if (std::fseek(f_, -1, SEEK_END) == 0 && std::fgetc(f_) != '\n') std::fputc('\n', f_);
  std::fseek(f_, 0, SEEK_END);
}

MetricsSink::~MetricsSink() {
  if (f_) std::fclose(f_);
}

void MetricsSink::write(const char* type, nlohmann::json fields) {
  if (!f_) return;
  nlohmann::json j{{"type", type}, {"time", utc_time_iso()}, {"elapsed", now_seconds() - started_}};
  j.update(fields);
  std::fprintf(f_, "%s\n", j.dump().c_str());
  std::fflush(f_);
}

}  // namespace spotrain
