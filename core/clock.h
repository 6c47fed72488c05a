// The clocks of the engine: seconds on a monotonic clock, for step times, wall-time limits
// and checkpoint intervals; and the UTC date and time, for records and logs.
#pragma once
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>

namespace spotrain {

inline double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Now in UTC as ISO 8601 with milliseconds: "2026-12-01T03:20:00.123Z".
inline std::string utc_time_iso() {
  using namespace std::chrono;
  const auto now = system_clock::now();
  const std::time_t t = system_clock::to_time_t(now);
  const long ms = long(duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}

}  // namespace spotrain
