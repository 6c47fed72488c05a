// Elementwise math written once for both backends: the CPU loops and the CUDA kernels call
// these, so the CPU tests cover the arithmetic the GPU runs.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/half.h"
#include "core/philox.h"  // SPOTRAIN_HD

namespace spotrain {

// One SGD step for one element, PyTorch's torch.optim.SGD semantics:
//   g = grad * grad_scale + wd * p;  m = momentum * m + g;  p -= lr * (nesterov ? g + momentum * m : m)
// Momentum buffers start at zero, so the first step's m is g, exactly as PyTorch's.
SPOTRAIN_HD void sgd_update(float& p, float grad, float& m, float lr, float momentum,
                            float wd, bool nesterov, float grad_scale) {
  float g = grad * grad_scale + wd * p;
  m = momentum * m + g;
  float d = nesterov ? g + momentum * m : m;
  p -= lr * d;
}

// LARS (You, Gitman and Ginsburg 2017, "Large Batch Training of Convolutional Networks") in
// the form of the MLPerf ResNet-50 reference, mlcommons/training
// image_classification/tensorflow2/lars_optimizer.py (LARSOptimizer.compute_lr and
// _resource_apply_dense). Per parameter tensor, with g = grad * grad_scale:
//   trust = eeta * ||w|| / (||g|| + wd * ||w|| + epsilon)   when ||w|| > 0 and ||g|| > 0, else 1
//   v = momentum * v + lr * trust * (g + wd * w);  w -= v   (Nesterov: w -= momentum * v + lr * trust * (g + wd * w))
// The learning rate is inside the momentum buffer (Keras's form), unlike torch.optim.SGD's.
// Tensors left out of the adaptation (batch norm, biases) take trust 1 and no weight decay.
//
// The squares one element adds to its tensor's ||w||^2 and ||g||^2, in double.
SPOTRAIN_HD void lars_norm_terms(float p, float grad, float grad_scale, double& w_sq,
                                 double& g_sq) {
  const float g = grad * grad_scale;
  w_sq += double(p) * double(p);
  g_sq += double(g) * double(g);
}

// The trust ratio of one tensor from its squared norms: 1 where either norm is zero (a layer
// whose gradient is zero, or whose weights are) or not a number, as the reference's
// where(||w|| > 0, where(||g|| > 0, ..., 1), 1): never a division by zero.
SPOTRAIN_HD float lars_trust_ratio(double w_sq, double g_sq, float eeta, float wd, float epsilon) {
  const double w = ::sqrt(w_sq), g = ::sqrt(g_sq);
  if (!(w > 0.0) || !(g > 0.0)) return 1.f;
  return float(double(eeta) * w / (g + double(wd) * w + double(epsilon)));
}

// One LARS step for one element, with scaled_lr = lr * the tensor's trust ratio.
SPOTRAIN_HD void lars_update(float& p, float grad, float& m, float scaled_lr, float momentum,
                             float wd, bool nesterov, float grad_scale) {
  const float g = grad * grad_scale + wd * p;
  const float step = scaled_lr * g;
  m = momentum * m + step;
  p -= nesterov ? momentum * m + step : m;
}

SPOTRAIN_HD float relu_fwd(float x) { return x > 0.f ? x : 0.f; }
SPOTRAIN_HD float relu_bwd(float dy, float y) { return y > 0.f ? dy : 0.f; }

// Running batch-norm statistics: running = (1 - momentum) * running + momentum * batch, the
// batch variance (biased) made unbiased with `unbias` = n / (n - 1).
SPOTRAIN_HD void bn_running_update(float& rm, float& rv, float mean, float var, float momentum,
                                   double unbias) {
  rm = (1.f - momentum) * rm + momentum * mean;
  rv = (1.f - momentum) * rv + momentum * float(var * unbias);
}

// Max pooling along one axis: the outputs o whose window [o * stride - pad, o * stride - pad
// + k) holds input i, o0..o1 (none when o0 > o1), among outputs 0..out-1.
SPOTRAIN_HD void pool_windows_holding(int i, int k, int stride, int pad, int out, int& o0,
                                      int& o1) {
  const int a = i + pad - (k - 1);
  o0 = a <= 0 ? 0 : (a + stride - 1) / stride;
  o1 = (i + pad) / stride;
  if (o1 > out - 1) o1 = out - 1;
}

// Whether `val`, scanned after `best` in a pooling window, becomes the window's maximum: a
// larger value, or the first NaN (NaN propagates); on ties the first position keeps it.
SPOTRAIN_HD bool pool_takes(float val, float best) {
  return val > best || (val != val && best == best);
}

// Batch-norm inference for one element: gamma * (x - mean) / sqrt(var + eps) + beta.
SPOTRAIN_HD float bn_infer(float x, float mean, float var, float gamma, float beta, float eps) {
  return gamma * (x - mean) * (1.f / ::sqrtf(var + eps)) + beta;
}

// One element of Backend::lerp.
SPOTRAIN_HD float lerp_value(float dst, float src, float weight) { return dst + weight * (src - dst); }

// Whether logit zj (class j) ranks above the label's zy (class y) for top-k: a larger value,
// a tie at a lower index, or either one NaN. NaN ranks above everything, so a row whose
// forward overflowed (NaN logits, an fp16 step then skipped) counts as wrong, not right:
// compared with > alone, every NaN row was "correct" (a skipped step read 100% top-1).
SPOTRAIN_HD bool ranks_above(float zj, int64_t j, float zy, int64_t y) {
  return !(zj < zy || (zj == zy && j >= y));
}

// Softmax cross-entropy with label smoothing for one row of logits z[0..m) and label y:
// target q = 1 - smoothing + smoothing/m at y, smoothing/m elsewhere. Returns the row's
// loss (log-sum-exp in double); *greater receives how many logits rank above the label's
// (ranks_above), so top-k is correct when *greater < k. When dz is non-null it receives
// (softmax - q) * dscale (dscale = grad_scale / batch).

SPOTRAIN_HD double softmax_xent_row(const float* z, int64_t m, int32_t y, float smoothing,
                                    float dscale, float* dz, int64_t* greater, int32_t yb = -1,
                                    float lam = 1.f) {
  float off = smoothing / float(m), on = 1.f - smoothing + off;
  float mx = z[0];
  for (int64_t j = 1; j < m; ++j) mx = z[j] > mx ? z[j] : mx;
  double se = 0, sum_z = 0;
  for (int64_t j = 0; j < m; ++j) {
    se += ::exp(double(z[j] - mx));
    sum_z += z[j];
  }
  double lse = ::log(se) + mx;
  double li = on * (lse - z[y]) + off * (double(m) * lse - sum_z) - off * (lse - z[y]);
  if (yb >= 0) {  // mixed targets: lam of y's loss, 1 - lam of yb's
    const double lb = on * (lse - z[yb]) + off * (double(m) * lse - sum_z) - off * (lse - z[yb]);
    li = double(lam) * li + double(1.f - lam) * lb;
  }
  int64_t g = 0;
  for (int64_t j = 0; j < m; ++j) g += ranks_above(z[j], j, z[y], y) ? 1 : 0;
  *greater = g;
  if (dz) {
    for (int64_t j = 0; j < m; ++j) {
      float p = float(::exp(double(z[j]) - lse));
      float q = j == y ? on : off;
      if (yb >= 0) q = lam * q + (1.f - lam) * (j == yb ? on : off);
      dz[j] = (p - q) * dscale;
    }
  }
  return li;
}

}  // namespace spotrain
