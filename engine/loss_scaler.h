// Dynamic loss scaling for fp16 training, with PyTorch GradScaler's defaults: start at
// 2^16, double after 2000 consecutive finite steps, halve on overflow (the step is then
// skipped). A static scale (--loss-scale N) never changes. Too many overflowed steps in a
// row stop training with a clear error instead of looping forever.
#pragma once
#include <cstdint>

#include "checkpoints/training_record.h"  // LossScalerState

namespace spotrain {

struct LossScalerOptions {
  bool enabled = false;
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double static_scale = 0.0;  // > 0: fixed scale
  int64_t max_consecutive_overflows = 50;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& opt);
  bool enabled() const { return opt_.enabled; }
  // The factor the loss is multiplied by (1 when disabled).
  double scale() const { return opt_.enabled ? st_.scale : 1.0; }
  // Records one step's overflow verdict; throws Error after too many overflows in a row.
  void update(bool overflow);
  const LossScalerState& state() const { return st_; }
  void set_state(const LossScalerState& s) { st_ = s; }

 private:
  LossScalerOptions opt_;
  LossScalerState st_;
};

}  // namespace spotrain
