// MetricsSink (see metrics.h).
#include "observe/metrics.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>

#include "core/atomic_file.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"

namespace spotrain {

namespace {

// Opens `path` to append, on a line of its own: a process killed mid-line left a torn record.
FILE* open_for_append(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "a+");
  SPOTRAIN_CHECK(f, "cannot write metrics file ", path, ": ", std::strerror(errno));
  if (std::fseek(f, -1, SEEK_END) == 0 && std::fgetc(f) != '\n') {
    std::fseek(f, 0, SEEK_END);  // a read and a write need a seek between them
    std::fputc('\n', f);
  }
  std::fseek(f, 0, SEEK_END);
  return f;
}

void put_record(FILE* f, const char* type, double elapsed, nlohmann::json fields) {
  nlohmann::json j{{"type", type}, {"time", utc_time_iso()}, {"elapsed", elapsed}};
  j.update(fields);
  // Text from outside (a notice's body) may be invalid UTF-8: replaced, never an error.
  std::fprintf(f, "%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  std::fflush(f);
}

}  // namespace

MetricsFile read_metrics_file(const std::string& path) {
  std::ifstream in(path);
  SPOTRAIN_CHECK(in, "cannot read the metrics file ", path);
  MetricsFile f;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !metrics_record_well_formed(j)) {
      ++f.torn;
      continue;
    }
    f.records.push_back(std::move(j));
  }
  return f;
}

double iso_seconds(const std::string& s) {
  std::tm tm{};
  int ms = 0;
  if (std::sscanf(s.c_str(), "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) < 6)
    return NAN;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return double(timegm(&tm)) + ms / 1000.0;
}

double record_seconds(const nlohmann::json& r) {
  if (!r.is_object() || !r.contains("time") || !r["time"].is_string()) return NAN;
  return iso_seconds(r["time"].get<std::string>());
}

double median_of(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

bool metrics_record_well_formed(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return false;
  for (const char* k : {"time", "path", "reason", "previous", "message", "checkpoint"})
    if (j.contains(k) && !j[k].is_string()) return false;
  if (j.contains("step") && !j["step"].is_number_integer()) return false;
  if (j.contains("superseded") && !j["superseded"].is_boolean()) return false;
  for (const char* k : {"elapsed", "images_per_sec", "data_wait_share", "test_top1"})
    if (j.contains(k) && !j[k].is_number()) return false;
  return true;
}

MetricsSink::MetricsSink(const std::string& path, bool enabled) : started_(now_seconds()) {
  if (path.empty() || !enabled) return;
  {  // the last record the file holds (a torn last line is skipped)
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (line.empty() || j.is_discarded() || !metrics_record_well_formed(j)) continue;
      previous_last_ = j;
      if (j["type"] == "start") ++previous_starts_;
    }
  }
  path_ = path;
  f_ = open_for_append(path);
}

int64_t MetricsSink::mark_superseded_after(int64_t step) {
  if (!f_) return 0;
  std::string text;
  int64_t marked = 0;
  {
    std::ifstream in(path_);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && metrics_record_well_formed(j) && j.contains("step") &&
          j["step"].get<int64_t>() > step && !j.value("superseded", false)) {
        j["superseded"] = true;
        line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        ++marked;
      }
      text += line + "\n";  // a torn line stays as it was
    }
  }
  if (marked == 0) return 0;
  std::fclose(f_);
  f_ = nullptr;
  write_file_atomic(path_, text, "the metrics file");
  f_ = open_for_append(path_);
  return marked;
}

MetricsSink::~MetricsSink() {
  if (f_) std::fclose(f_);
}

void MetricsSink::write(const char* type, nlohmann::json fields) {
  if (!f_) return;
  put_record(f_, type, now_seconds() - started_, std::move(fields));
}

void MetricsSink::announce(const char* type, nlohmann::json fields) {
  if (log_enabled()) {
    nlohmann::json line = fields;
    line["type"] = type;
    std::fprintf(stdout, "%s %s\n", kLauncherRecord, line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    std::fflush(stdout);
  }
  write(type, std::move(fields));
}

void MetricsSink::append(const std::string& path, const char* type, nlohmann::json fields) {
  FILE* f = open_for_append(path);
  put_record(f, type, 0, std::move(fields));
  std::fclose(f);
}

}  // namespace spotrain
