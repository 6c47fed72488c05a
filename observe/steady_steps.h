// The steady-state step time every estimate of a run is made from (the ETA, what a stop takes,
// the --max-wall-time margin, the cost of a checkpoint): the median of the latest steps,
// leaving out the first step of a process and of each epoch, whose time holds start-up, the
// loader's restart or the evaluation before it (a demo's first step took 3 times a later one,
// and its ETA promised three times the run).
#pragma once
#include <cstdint>
#include <deque>

namespace spotrain {

class SteadySteps {
 public:
  // Fewer steps kept than this: no steady time yet (seconds() is 0).
  static constexpr int kMinSteps = 3;
  // The median is over at most this many of the latest steps.
  static constexpr int kWindow = 50;

  // The next step follows a break (the process's start, an epoch's end): it is not kept.
  void restart() { skip_next_ = true; }
  void add(double seconds);
  // The median of the latest steps kept, or 0 while fewer than kMinSteps were.
  double seconds() const;
  int64_t kept() const { return kept_; }

 private:
  std::deque<double> latest_;
  bool skip_next_ = true;
  int64_t kept_ = 0;
};

}  // namespace spotrain
