// Learning-rate schedules as pure functions of the global step: linear warmup from ~0 to the
// base rate, then cosine decay to zero or step decay (x gamma at each milestone).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace spotrain {

struct LrSchedule {
  std::string kind = "cosine";     // "cosine", "step" or "constant"
  float base_lr = 0.1f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  std::vector<int64_t> milestones;  // steps, for "step"
  float gamma = 0.1f;

  // Throws Error for an unknown kind or a negative rate.
  void validate() const;
  float at(int64_t step) const;
};

}  // namespace spotrain
