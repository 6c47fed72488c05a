// The training step written out from the model's and backend's primitives, every figure read
// at once (the loss, then the overflow verdict, before the update is decided on the host):
// the reference the StepRunner, which reads them a step later, is checked against.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "engine/loss_scaler.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "engine/step.h"
#include "kernels/ops.h"

namespace spotrain {

inline StepResult reference_step(Model& model, Sgd& sgd, LossScaler& scaler, DType dt,
                                 const Tensor& images, const int32_t* labels, float lr,
                                 float smoothing) {
  Backend& be = model.backend();
  StepResult r;
  r.loss_scale = scaler.scale();
  Tensor logits = model.forward(be.upload_images(images, dt), /*training=*/true);
  Tensor dlogits;
  r.loss = be.softmax_xent(logits, labels, smoothing, float(r.loss_scale), &dlogits);
  model.backward(dlogits);
  if (scaler.enabled())
    r.overflow = be.unscale_and_check(model.flat_grads(), float(1.0 / r.loss_scale));
  if (!r.overflow) sgd.step(lr);
  scaler.update(r.overflow);
  return r;
}

// Expects `got` to hold the figures of `want`, step by step (verdict, scale, loss, top-1);
// returns the overflows in `want`.
inline int expect_same_results(const std::vector<StepResult>& got,
                               const std::vector<StepResult>& want) {
  EXPECT_EQ(got.size(), want.size());
  int overflows = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    EXPECT_EQ(got[i].overflow, want[i].overflow) << "step " << i;
    EXPECT_EQ(got[i].loss_scale, want[i].loss_scale) << "step " << i;
    EXPECT_EQ(got[i].loss.loss, want[i].loss.loss) << "step " << i;
    EXPECT_EQ(got[i].loss.top1, want[i].loss.top1) << "step " << i;
    overflows += want[i].overflow;
  }
  return overflows;
}

// A loss scaler that overflows fp16 at first (2^40), backs off, and grows back every
// `growth` finite steps, so a short run both skips and applies steps.
inline LossScaler bouncing_scaler(int64_t growth = 2) {
  LossScalerOptions o;
  o.enabled = true;
  o.init_scale = 1099511627776.0;  // 2^40
  o.growth_interval = growth;
  o.max_consecutive_overflows = 1000;
  return LossScaler(o);
}

}  // namespace spotrain
