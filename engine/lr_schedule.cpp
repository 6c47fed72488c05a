// LrSchedule (see lr_schedule.h).
#include "engine/lr_schedule.h"

#include <cmath>

#include "core/error.h"

namespace spotrain {

void LrSchedule::validate() const {
  SPOTRAIN_CHECK(kind == "cosine" || kind == "step" || kind == "constant" || kind == "poly",
                 "unknown --lr-schedule '", kind, "'; use cosine, step, constant or poly");
  SPOTRAIN_CHECK(end_lr >= 0.f && std::isfinite(end_lr), "--lr-end must be a non-negative number, got ",
                 end_lr);
  SPOTRAIN_CHECK(poly_power > 0.f && std::isfinite(poly_power),
                 "--lr-poly-power must be a positive number, got ", poly_power);
  SPOTRAIN_CHECK(base_lr >= 0.f && std::isfinite(base_lr), "--lr must be a non-negative number, got ",
                 base_lr);
  SPOTRAIN_CHECK(warmup_steps >= 0, "warmup must not be negative");
}

float LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps)
    return base_lr * float(step + 1) / float(warmup_steps);
  if (kind == "constant") return base_lr;
  if (kind == "step") {
    float lr = base_lr;
    for (auto m : milestones)
      if (step >= m) lr *= gamma;
    return lr;
  }
  int64_t span = total_steps - warmup_steps;
  if (span <= 0) return base_lr;
  double t = double(step - warmup_steps) / double(span);
  if (t > 1) t = 1;
  if (kind == "poly")
    return float((double(base_lr) - double(end_lr)) * std::pow(1.0 - t, double(poly_power)) +
                 double(end_lr));
  return float(0.5 * base_lr * (1.0 + std::cos(M_PI * t)));
}

}  // namespace spotrain
