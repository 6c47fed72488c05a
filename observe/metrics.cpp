// MetricsSink (see metrics.h).
#include "observe/metrics.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "core/clock.h"
#include "core/error.h"

namespace spotrain {

MetricsSink::MetricsSink(const std::string& path, bool enabled) : started_(now_seconds()) {
  if (path.empty() || !enabled) return;
  {  // the last record the file holds (a torn last line is skipped)
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (line.empty() || j.is_discarded()) continue;
      previous_last_ = j;
      if (j.is_object() && j.value("type", "") == "start") ++previous_starts_;
    }
  }
  f_ = std::fopen(path.c_str(), "a+");
  SPOTRAIN_CHECK(f_, "cannot write metrics file ", path, ": ", std::strerror(errno));
  // A process killed mid-line left a torn record: start on a line of our own.
  if (std::fseek(f_, -1, SEEK_END) == 0 && std::fgetc(f_) != '\n') {
    std::fseek(f_, 0, SEEK_END);  // a read and a write need a seek between them
    std::fputc('\n', f_);
  }
  std::fseek(f_, 0, SEEK_END);
}

MetricsSink::~MetricsSink() {
  if (f_) std::fclose(f_);
}

void MetricsSink::write(const char* type, nlohmann::json fields) {
  if (!f_) return;
  nlohmann::json j{{"type", type}, {"time", utc_time_iso()}, {"elapsed", now_seconds() - started_}};
  j.update(fields);
  // Text from outside (a notice's body) may be invalid UTF-8: replaced, never an error.
  std::fprintf(f_, "%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  std::fflush(f_);
}

}  // namespace spotrain
