// The training step written out from the model's and backend's primitives, every figure read
// at once (the loss, then the overflow verdict, before the update is decided on the host):
// the reference the StepRunner, which reads them a step later, is checked against; and the
// batches, mixed targets and loss scaler the step tests on the CPU and the GPU share.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/philox.h"

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

// A loss scaler that overflows fp16 at first, backs off, and grows back every `growth` finite
// steps, so a short run both skips and applies steps. ResNet-20's fp16 gradients on
// fmnist_like_batch fit up to a scale of about 2^22 (the CPU's fp16, which rounds as a GPU
// does): from 2^26 the first four steps overflow. (From 2^40 the first eighteen did, and a
// fourteen-step test could never apply one.)
inline LossScaler bouncing_scaler(int64_t growth = 2) {
  LossScalerOptions o;
  o.enabled = true;
  o.init_scale = 67108864.0;  // 2^26
  o.growth_interval = growth;
  o.max_consecutive_overflows = 1000;
  return LossScaler(o);
}

// Fashion-MNIST-shaped batches (N, 1, 28, 28) of normal noise, host fp32 NHWC, the label a
// function of the image so the loss falls.
struct StepBatch {
  Tensor images;
  std::vector<int32_t> labels;
};
inline StepBatch fmnist_like_batch(int64_t n, uint64_t seed) {
  StepBatch b;
  b.images = Tensor::host({n, 1, 28, 28}, DType::f32, Layout::nhwc);
  Philox rng(seed, 77);
  float* p = b.images.data<float>();
  for (int64_t i = 0; i < b.images.numel(); ++i) p[i] = rng.normal();
  for (int64_t i = 0; i < n; ++i)
    b.labels.push_back(int32_t(std::fabs(p[i * 784] + p[i * 784 + 400]) * 4.f) % 10);
  return b;
}

// Mixed targets for a batch (as mixup makes them): each row's second label is the labels
// reversed, its first label's weight from 0.25 to 0.75 down the batch. Holds the arrays
// LabelMix points into.
struct MixedTargets {
  std::vector<int32_t> labels_b;
  std::vector<float> lam;
  LabelMix mix() const { return LabelMix{labels_b.data(), lam.data()}; }
};
inline MixedTargets reversed_mix(const std::vector<int32_t>& labels) {
  MixedTargets m;
  m.labels_b.assign(labels.rbegin(), labels.rend());
  for (size_t k = 0; k < labels.size(); ++k)
    m.lam.push_back(0.25f + 0.5f * float(k) / float(labels.size()));
  return m;
}

// Runs `steps` steps on `runner`, queued back to back (lr 0.05, weight decay 0.1), on batches of
// 16 from seeds seed, seed + 1, ... (with `mixed`, their reversed_mix targets), and returns the
// steps' figures in order.
inline std::vector<StepResult> queued_steps(StepRunner& runner, int steps, uint64_t seed, bool mixed) {
  std::vector<StepResult> out;
  for (int i = 0; i < steps; ++i) {
    StepBatch b = fmnist_like_batch(16, seed + uint64_t(i));
    const MixedTargets targets = reversed_mix(b.labels);
    const LabelMix mix = targets.mix();
    runner.queue(b.images, b.labels.data(), 0.05f, 0.1f, nullptr, mixed ? &mix : nullptr);
    for (const StepResult& r : runner.take_results()) out.push_back(r);
  }
  runner.settle();
  for (const StepResult& r : runner.take_results()) out.push_back(r);
  return out;
}

}  // namespace spotrain
