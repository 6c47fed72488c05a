// Elementwise math written once for both backends: the CPU loops and the CUDA kernels call
// these, so the CPU tests cover the arithmetic the GPU runs.
#pragma once
#include <cmath>
#include <cstdint>

#include "engine/philox.h"  // SPOTRAIN_HD

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

// Softmax cross-entropy with label smoothing for one row of logits z[0..m) and label y:
// target q = 1 - smoothing + smoothing/m at y, smoothing/m elsewhere. Returns the row's
// loss (log-sum-exp in double); *greater receives how many logits beat the label's (ties
// count for the lower index), so top-k is correct when *greater < k. When dz is non-null it
// receives (softmax - q) * dscale (dscale = grad_scale / batch).
SPOTRAIN_HD double softmax_xent_row(const float* z, int64_t m, int32_t y, float smoothing,
                                    float dscale, float* dz, int64_t* greater) {
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
  int64_t g = 0;
  for (int64_t j = 0; j < m; ++j)
    if (z[j] > z[y] || (z[j] == z[y] && j < y)) ++g;
  *greater = g;
  if (dz) {
    for (int64_t j = 0; j < m; ++j) {
      float p = float(::exp(double(z[j]) - lse));
      float q = j == y ? on : off;
      dz[j] = (p - q) * dscale;
    }
  }
  return li;
}

}  // namespace spotrain

namespace spotrain {

// ---- storage types: bf16 and IEEE fp16 as raw 16-bit words, round-to-nearest-even ----

SPOTRAIN_HD uint32_t f32_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}
SPOTRAIN_HD float bits_f32(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

SPOTRAIN_HD uint16_t float_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
SPOTRAIN_HD float bf16_to_float(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

// IEEE binary16: values of magnitude >= 65520 become inf, as on a GPU.
SPOTRAIN_HD uint16_t float_to_half(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return uint16_t(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504: inf
  if (a < 0x38800000u) {                                   // subnormal or zero in fp16
    if (a < 0x33000000u) return sign;                      // below half the smallest subnormal
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - int(a >> 23);                        // 14..24
    // value = mant * 2^(e - 150) = (mant >> shift) * 2^-24: keep 24 - shift bits, round.
    uint32_t r = mant >> shift;
    uint32_t dropped = mant & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (dropped > halfway || (dropped == halfway && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
}
SPOTRAIN_HD float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return bits_f32(sign);
    float v = float(m) * (1.0f / 16777216.0f);  // m * 2^-24
    return sign ? -v : v;
  }
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace spotrain
