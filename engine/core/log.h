// Progress output: one line per message on stdout (rank 0 only once distributed), plus
// small formatting helpers for fixed-point numbers and durations.
#pragma once
#include <cstdio>
#include <string>

namespace spotrain {

// Only rank 0 prints progress; other ranks call set_log_enabled(false).
inline bool& log_enabled() {
  static bool on = true;
  return on;
}
inline void set_log_enabled(bool on) { log_enabled() = on; }

inline void log_info(const std::string& s) {
  if (!log_enabled()) return;
  std::fprintf(stdout, "%s\n", s.c_str());
  std::fflush(stdout);
}

inline std::string fmt_fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
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
