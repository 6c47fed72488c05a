// Input-bound diagnosis while training: progress windows are pooled until they cover at least
// 20 steps, then judged. When the ranks waited for data more than 10% of the time (or more
// than 5% while the GPU's SM utilisation stayed under 70%), one warning says so and what to
// try; it is not repeated for the rest of the process.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace spotrain {

class InputWatch {
 public:
  static constexpr int64_t kMinSteps = 20;
  static constexpr double kWaitShare = 0.10, kWaitShareLowGpu = 0.05, kLowSmUtil = 70.0;

  explicit InputWatch(int workers) : workers_(workers) {}
  // The rule: steps that waited `wait_share` of their time for data are input-bound (the GPU's
  // SM utilisation, when known, lowers the bar). `spotrain bench` judges its steps by it too.
  static bool input_bound(double wait_share, std::optional<double> sm_util) {
    return wait_share > kWaitShare || (sm_util && *sm_util < kLowSmUtil && wait_share > kWaitShareLowGpu);
  }
  // One progress window: steps first_step..last_step took `seconds`, of which the ranks waited
  // `wait_seconds` (mean over ranks) for their batch. Returns the warning when this window
  // shows the run input-bound for the first time, else "".
  std::string add(int64_t first_step, int64_t last_step, double wait_seconds, double seconds,
                  std::optional<double> sm_util);
  bool warned() const { return warned_; }
  // What the warning judged: the share of time spent waiting for data, the steps it covered.
  double share() const { return share_; }
  int64_t from_step() const { return judged_from_; }
  int64_t to_step() const { return judged_to_; }

 private:
  int workers_;
  bool warned_ = false;
  int64_t from_ = -1, steps_ = 0;
  double wait_ = 0, seconds_ = 0, sm_sum_ = 0;
  int sm_n_ = 0;
  double share_ = 0;
  int64_t judged_from_ = 0, judged_to_ = 0;
};

}  // namespace spotrain
