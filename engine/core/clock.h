// The one clock of the engine: seconds on a monotonic clock, for step times, wall-time
// limits and checkpoint intervals (never for dates).
#pragma once
#include <chrono>

namespace spotrain {

inline double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace spotrain
