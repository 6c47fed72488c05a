// Learning-rate schedules as pure functions of the global step: linear warmup from ~0 to the
// base rate, then cosine decay to zero, step decay (x gamma at each milestone), or polynomial
// decay to end_lr (the MLPerf ResNet-50 LARS reference's, power 2).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace spotrain {

struct LrSchedule {
  std::string kind = "cosine";     // "cosine", "step", "constant" or "poly"
  float base_lr = 0.1f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  std::vector<int64_t> milestones;  // steps, for "step"
  float gamma = 0.1f;
  // "poly": after the warm-up, (base_lr - end_lr) * (1 - (step - warmup) / (total - warmup))^power
  // + end_lr. Defaults: mlcommons/training image_classification/tensorflow2/lars_util.py
  // (PolynomialDecayWithWarmup: end_learning_rate 0.0001, power 2.0).
  float end_lr = 0.0001f;
  float poly_power = 2.f;

  // Throws Error for an unknown kind or a negative rate.
  void validate() const;
  float at(int64_t step) const;
};

}  // namespace spotrain
