// Batch norm on bf16 NHWC activations with AVX-512 (see bn_nhwc.h). Each pass splits the
// N*H*W rows evenly over the OpenMP threads; a row's C channels are 16-wide vectors, the
// per-channel sums are each thread's own and are added in thread order, so results do not
// depend on timing (only on the thread count, as oneDNN's do).
#include "kernels/cpu/bn_nhwc.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/bf16_avx512.h"

namespace spotrain::cpu {

bool bn_nhwc_bf16_usable(int64_t channels) {
  return have_avx512bw() && channels > 0 && channels % 16 == 0;
}

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own undefined-vector helpers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

// dy, or with relu dy where the forward's output was positive: its pre-ReLU value x * scale +
// shift made again from x (the same fused multiply-add as the forward's).
SPOTRAIN_AVX512 inline __m512 masked_grad(const uint16_t* dy, __m512 xv, const float* scale,
                                          const float* shift, bool relu) {
  const __m512 g = bf16x16_load(dy);
  if (!relu) return g;
  const __m512 v = _mm512_fmadd_ps(xv, _mm512_loadu_ps(scale), _mm512_loadu_ps(shift));
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ), g);
}

inline float bf16_value(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// Thread t's rows of `rows` split over `nt` threads.
inline void my_rows(int64_t rows, int t, int nt, int64_t& r0, int64_t& r1) {
  r0 = rows * t / nt;
  r1 = rows * (t + 1) / nt;
}

// Per-thread partial sums: `sums` arrays of c floats for each of nt threads, zeroed.
struct Partials {
  int nt;
  int64_t width;  // floats per thread
  std::vector<float> v;
  Partials(int64_t c, int sums) : nt(omp_get_max_threads()), width(c * sums), v(size_t(nt) * width, 0.f) {}
  // Inside a parallel region: the calling thread's slot, and its rows [r0, r1) of `rows`.
  float* mine(int64_t rows, int64_t& r0, int64_t& r1) {
    my_rows(rows, omp_get_thread_num(), omp_get_num_threads(), r0, r1);
    return v.data() + size_t(omp_get_thread_num()) * width;
  }
  // The threads' sums added in thread order.
  std::vector<float> total() const {
    std::vector<float> out(size_t(width), 0.f);
    for (int t = 0; t < nt; ++t)
      for (int64_t i = 0; i < width; ++i) out[i] += v[size_t(t) * width + i];
    return out;
  }
};

// y = [relu](x * scale + shift [+ z]) over every row.
SPOTRAIN_AVX512 void apply(const uint16_t* x, const uint16_t* z, int64_t rows, int64_t c,
                           const float* scale, const float* shift, bool relu, uint16_t* y) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < c; b += 16) {
      __m512 v = _mm512_fmadd_ps(bf16x16_load(x + r * c + b), _mm512_loadu_ps(scale + b), _mm512_loadu_ps(shift + b));
      if (z) v = _mm512_add_ps(v, bf16x16_load(z + r * c + b));
      if (relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
      bf16x16_store(y + r * c + b, v);
    }
}

void scale_shift(int64_t c, const float* gamma, const float* beta, const float* mean,
                 const float* var, float eps, std::vector<float>& scale, std::vector<float>& shift) {
  scale.resize(c);
  shift.resize(c);
  for (int64_t i = 0; i < c; ++i) {
    scale[i] = gamma[i] / std::sqrt(var[i] + eps);
    shift[i] = beta[i] - mean[i] * scale[i];
  }
}

}  // namespace

SPOTRAIN_AVX512 void bn_nhwc_bf16_forward_train(const uint16_t* x, const uint16_t* z, int64_t rows,
                                                int64_t c, const float* gamma, const float* beta,
                                                float eps, bool relu, uint16_t* y, float* mean,
                                                float* var) {
  // One pass for both sums, of x less a pivot per channel (the first row's value): the
  // variance E[d^2] - E[d]^2 of d = x - pivot loses nothing to a mean far from zero.
  const uint16_t* pivot = x;
  Partials part(c, 2);
#pragma omp parallel num_threads(part.nt)
  {
    int64_t r0, r1;
    float* acc = part.mine(rows, r0, r1);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t b = 0; b < c; b += 16) {
        const __m512 d = _mm512_sub_ps(bf16x16_load(x + r * c + b), bf16x16_load(pivot + b));
        _mm512_storeu_ps(acc + b, _mm512_add_ps(_mm512_loadu_ps(acc + b), d));
        _mm512_storeu_ps(acc + c + b, _mm512_fmadd_ps(d, d, _mm512_loadu_ps(acc + c + b)));
      }
  }
  const std::vector<float> s = part.total();
  for (int64_t i = 0; i < c; ++i) {
    const float p = bf16_value(pivot[i]);
    const float m = s[i] / float(rows);
    mean[i] = p + m;
    var[i] = std::max(0.f, s[c + i] / float(rows) - m * m);
  }
  std::vector<float> scale, shift;
  scale_shift(c, gamma, beta, mean, var, eps, scale, shift);
  apply(x, z, rows, c, scale.data(), shift.data(), relu, y);
}

void bn_nhwc_bf16_forward_infer(const uint16_t* x, int64_t rows, int64_t c, const float* gamma,
                                const float* beta, const float* mean, const float* var, float eps,
                                bool relu, uint16_t* y) {
  std::vector<float> scale, shift;
  scale_shift(c, gamma, beta, mean, var, eps, scale, shift);
  apply(x, nullptr, rows, c, scale.data(), shift.data(), relu, y);
}

SPOTRAIN_AVX512 void bn_nhwc_bf16_backward(const uint16_t* dy, const uint16_t* x, int64_t rows,
                                           int64_t c, const float* gamma, const float* beta,
                                           const float* mean, const float* var, float eps,
                                           bool relu, uint16_t* dx, float* dgamma, float* dbeta) {
  std::vector<float> scale, shift;
  scale_shift(c, gamma, beta, mean, var, eps, scale, shift);
  const float* sc = scale.data();
  const float* sh = shift.data();
  // g = masked_grad; sums: [0, c) sum of g, [c, 2c) sum of g * (x - mean).
  Partials part(c, 2);
#pragma omp parallel num_threads(part.nt)
  {
    int64_t r0, r1;
    float* acc = part.mine(rows, r0, r1);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t b = 0; b < c; b += 16) {
        const int64_t off = r * c + b;
        const __m512 xv = bf16x16_load(x + off);
        const __m512 g = masked_grad(dy + off, xv, sc + b, sh + b, relu);
        const __m512 d = _mm512_sub_ps(xv, _mm512_loadu_ps(mean + b));
        _mm512_storeu_ps(acc + b, _mm512_add_ps(_mm512_loadu_ps(acc + b), g));
        _mm512_storeu_ps(acc + c + b, _mm512_fmadd_ps(g, d, _mm512_loadu_ps(acc + c + b)));
      }
  }
  const std::vector<float> sums = part.total();
  // dx = scale * (g - sum_g / M - (x - mean) * rstd^2 * sum_gd / M)
  std::vector<float> k1(c), k2(c);
  for (int64_t i = 0; i < c; ++i) {
    const float rstd = 1.f / std::sqrt(var[i] + eps);
    dbeta[i] = sums[i];
    dgamma[i] = sums[c + i] * rstd;
    k1[i] = sums[i] / float(rows);
    k2[i] = rstd * rstd * sums[c + i] / float(rows);
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < c; b += 16) {
      const int64_t off = r * c + b;
      const __m512 xv = bf16x16_load(x + off);
      const __m512 g = masked_grad(dy + off, xv, sc + b, sh + b, relu);
      const __m512 d = _mm512_sub_ps(xv, _mm512_loadu_ps(mean + b));
      __m512 v = _mm512_sub_ps(g, _mm512_loadu_ps(k1.data() + b));
      v = _mm512_fnmadd_ps(d, _mm512_loadu_ps(k2.data() + b), v);
      bf16x16_store(dx + off, _mm512_mul_ps(v, _mm512_loadu_ps(sc + b)));
    }
}

#pragma GCC diagnostic pop

}  // namespace spotrain::cpu
