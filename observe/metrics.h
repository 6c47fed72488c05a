// The JSONL metrics file (--metrics, by default metrics.jsonl in the run folder), written by
// rank 0 and appended across restarts: per process a start record (backend, ranks, machine,
// every setting), after a resume a resume record (from which step and checkpoint, and how the
// previous process ended), one record per progress line and per evaluated epoch, and a stop or
// end record. Every record carries "time" (UTC) and "elapsed" (seconds since this process's
// run began). Each line is flushed as written. A resume marks the records of the steps it
// rolls back (after its checkpoint's step) "superseded": true, so the unmarked records are one
// history, whatever order a reader keeps.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace spotrain {

// Whether a parsed line is a record as spotrain writes them: an object with a string "type"
// and, where present, the fields readers use of the types they use. Anything else in a metrics
// file (a torn line, a line another tool wrote) is skipped by every reader, never an error
// that names a JSON type instead of the file.
bool metrics_record_well_formed(const nlohmann::json& j);

// A metrics file read whole, as every reader (report, plan --from-run) reads it: the
// well-formed records in file order, and how many lines were not (torn by a kill, or another
// tool's). Throws Error when the file cannot be opened.
struct MetricsFile {
  std::vector<nlohmann::json> records;
  int64_t torn = 0;
};
MetricsFile read_metrics_file(const std::string& path);
// "2026-12-01T07:59:12.825Z" -> seconds since 1970; NaN when it does not parse.
double iso_seconds(const std::string& s);
// A record's "time" in seconds since 1970; NaN when it has none or it does not parse.
double record_seconds(const nlohmann::json& record);
// The median of v (the upper middle for an even count); NaN for none.
double median_of(std::vector<double> v);

class MetricsSink {
 public:
  // path "" or enabled = false: a sink that writes nothing.
  MetricsSink(const std::string& path, bool enabled);
  // The last record the file held before this process appended to it (null when none).
  const nlohmann::json& previous_last() const { return previous_last_; }
  // How many "start" records the file held before this process: the run's earlier processes.
  int64_t previous_starts() const { return previous_starts_; }
  ~MetricsSink();
  MetricsSink(const MetricsSink&) = delete;
  MetricsSink& operator=(const MetricsSink&) = delete;
  bool enabled() const { return f_ != nullptr; }
  // Marks every record with a "step" after `step` (the steps a resume from `step` trains again)
  // "superseded": true, rewriting the file atomically; returns how many it marked.
  int64_t mark_superseded_after(int64_t step);
  // Writes one record with "type": type and the given fields.
  void write(const char* type, nlohmann::json fields);
  // A record a launcher acts on (a decision to leave a host behind): written as write() does,
  // and printed on stdout, by rank 0 only (log_enabled()) whether or not a metrics file is
  // kept, as one line: kLauncherRecord, a space, the record's JSON. mpirun.sh reads these
  // lines, never the log's wording.
  static constexpr const char* kLauncherRecord = "spotrain-record";
  void announce(const char* type, nlohmann::json fields);
  // Appends one record to `path` without reading the file first (a rank with no sink of its
  // own that must report at once, e.g. a survivor of a lost peer). Throws when it cannot.
  static void append(const std::string& path, const char* type, nlohmann::json fields);

 private:
  FILE* f_ = nullptr;
  std::string path_;
  double started_ = 0;
  nlohmann::json previous_last_;
  int64_t previous_starts_ = 0;
};

}  // namespace spotrain
