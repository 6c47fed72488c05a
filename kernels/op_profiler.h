// OpProfiler: attached to any Backend (Backend::set_profiler), it times every op the backend
// runs (GPU: marks in the device's queue through its DeviceClock; CPU: the host clock), so
// `spotrain bench --profile` can say where a step's time goes, op by op and shape by shape,
// without a vendor profiler. Every op is timed by the one wrapper in kernels/ops.cpp.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace spotrain {

// Marks recorded in a device's queue and read back as times (the CUDA backend: events).
class DeviceClock {
 public:
  virtual ~DeviceClock() = default;
  // Records a mark behind the work queued so far; returns its index since the last read.
  virtual int record_mark() = 0;
  // Waits for the marks recorded since the last call and returns each one's time in ms after
  // the first; forgets them.
  virtual std::vector<double> read_marks_ms() = 0;
};

class OpProfiler {
 public:
  // Times the ops of `be` until destroyed.
  explicit OpProfiler(Backend& be);
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  // One line of the report: an op (or op and shape), its time and calls per step.
  struct Row {
    std::string name;
    double ms_per_step = 0;
    double calls_per_step = 0;
  };
  // Collects the times of the ops run since the last collect() into the totals; call at step
  // boundaries (it waits for the device). `count` says whether this step is counted.
  void collect(bool count);
  // Reads the device clock's marks of the ops run since the last collect() into their
  // durations, kept for the next collect(): the clock is then free for someone else's marks
  // (engine/fusion_choice.cpp times with it mid-step). Waits for the device.
  void resolve_pending();
  // Totals per op and per op+shape (heaviest first), averaged over the counted steps.
  std::vector<Row> by_op() const;
  std::vector<Row> by_shape(size_t top) const;
  // The report as printable lines.
  std::vector<std::string> report(size_t top_shapes = 15) const;

  // Brackets one op (Backend's wrapper calls these): begin() before it runs, end() after,
  // with the op's name and a short description of its shape.
  struct Open {
    int mark = -1;
    double host_ms = 0;
  };
  Open begin();
  void end(const Open& o, const char* op, std::string shape);

 private:
  Backend& be_;
  DeviceClock* clock_;  // null: the host clock
  struct Pending {
    int begin_mark, end_mark;  // -1: resolved into host_ms
    double host_ms;  // host clock, or resolve_pending(): the duration
    std::string op, shape;
  };
  std::vector<Pending> pending_;
  struct Total {
    double ms = 0;
    int64_t calls = 0;
  };
  std::map<std::string, Total> ops_, shapes_;
  int64_t steps_ = 0;
};

}  // namespace spotrain
