// Progress output: one line per message on stdout (rank 0 only once distributed), copied
// with the time into the run's log file when one is open; plus small formatting helpers for
// fixed-point numbers and durations.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <string>

#include "core/clock.h"

namespace spotrain {

// Only rank 0 prints progress; other ranks call set_log_enabled(false).
inline bool& log_enabled() {
  static bool on = true;
  return on;
}
inline void set_log_enabled(bool on) { log_enabled() = on; }

// The run's log file (appended; nullptr = none), owned by whoever opened it.
inline FILE*& log_file() {
  static FILE* f = nullptr;
  return f;
}
// Appends "TIME line" to the log file, if one is open.
inline void log_to_file(const std::string& s) {
  if (FILE* f = log_file()) {
    std::fprintf(f, "%s %s\n", utc_time_iso().c_str(), s.c_str());
    std::fflush(f);
  }
}

inline void log_info(const std::string& s) {
  if (!log_enabled()) return;
  std::fprintf(stdout, "%s\n", s.c_str());
  std::fflush(stdout);
  log_to_file(s);
}

// This machine's host name (as log lines and lock notes name it).
inline std::string host_name() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  return host;
}

inline std::string fmt_fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// Scientific notation with two decimals: "3.10e-06".
inline std::string fmt_sci(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

inline std::string fmt_duration(double s) {
  char buf[64];
  if (!(s >= 0)) s = 0;
  long t = long(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%.1fs", s);
  return buf;
}

}  // namespace spotrain
