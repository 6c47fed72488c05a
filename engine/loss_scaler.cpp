// LossScaler (see loss_scaler.h).
#include "engine/loss_scaler.h"

#include "core/error.h"

namespace spotrain {

LossScaler::LossScaler(const LossScalerOptions& opt) : opt_(opt) {
  SPOTRAIN_CHECK(opt.static_scale >= 0, "--loss-scale must not be negative");
  SPOTRAIN_CHECK(opt.max_consecutive_overflows > 0, "--max-overflow-steps must be positive");
  st_.scale = opt.static_scale > 0 ? opt.static_scale : opt.init_scale;
}

void LossScaler::update(bool overflow) {
  if (!opt_.enabled) return;
  if (overflow) {
    st_.skipped_steps++;
    st_.consecutive_overflows++;
    st_.good_steps = 0;
    if (opt_.static_scale <= 0) st_.scale *= opt_.backoff_factor;
    if (st_.consecutive_overflows >= opt_.max_consecutive_overflows)
      SPOTRAIN_THROW("fp16 loss scaling: ", st_.consecutive_overflows,
                     " consecutive steps overflowed (loss scale now ", st_.scale,
                     "); the model diverged or --loss-scale is too high; lower --lr or use "
                     "--precision bf16");
    return;
  }
  st_.consecutive_overflows = 0;
  if (opt_.static_scale > 0) return;
  if (++st_.good_steps >= opt_.growth_interval) {
    st_.scale *= opt_.growth_factor;
    st_.good_steps = 0;
  }
}

}  // namespace spotrain
