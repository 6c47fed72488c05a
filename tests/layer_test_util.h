// The helpers of the layer tests (test_layers_*.cpp): fresh Philox inputs, tensors in each
// layout, NaN poisoning, central finite differences and the float64 references. Internal
// linkage (an unnamed namespace): each test file of the suite gets its own copy.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/model.h"
#include "core/philox.h"
#include "kernels/cpu/blocked.h"
#include "kernels/op_profiler.h"
#include "layers/containers.h"
#include "layers/layers.h"
#include "layers/resnet.h"

using namespace spotrain;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
using Vec = std::vector<double>;
using Floats = std::vector<float>;

// One compute thread by default: these tests make thousands of tiny calls, and on a shared
// two-core machine every OpenMP barrier of a two-thread team can cost a time slice. The
// checkpointing test runs with two threads as well.
std::unique_ptr<Backend> cpu_backend(int threads = 1) {
  return make_backend("cpu", BackendOptions{threads, false});
}

// ---- random inputs --------------------------------------------------------------------------

Floats normals(int64_t n, uint32_t stream, float scale = 1.f, float shift = 0.f) {
  Philox rng(20240601, stream, 0x7e57u);
  Floats v(static_cast<size_t>(n));
  for (auto& x : v) x = shift + scale * rng.normal();
  return v;
}

inline Floats uniforms(int64_t n, uint32_t stream, float lo, float hi) {
  Philox rng(20240601, stream, 0x0111u);
  Floats v(static_cast<size_t>(n));
  for (auto& x : v) x = lo + (hi - lo) * rng.uniform();
  return v;
}

// Normals pushed away from zero (|x| >= gap), so a ReLU kink is never within a step.
inline Floats normals_off_zero(int64_t n, uint32_t stream, float gap) {
  Floats v = normals(n, stream);
  for (auto& x : v) x = x >= 0.f ? x + gap : x - gap;
  return v;
}

// Distinct values 0.05 apart per (N, C) plane in random order: no max-pool ties, and a step
// of 1e-3 never changes which element of a window is the largest.
inline Floats distinct_planes(int64_t planes, int64_t hw, uint32_t stream) {
  Philox rng(20240601, stream, 0xd15du);
  Floats v(static_cast<size_t>(planes * hw));
  std::vector<int> perm(static_cast<size_t>(hw));
  for (int64_t p = 0; p < planes; ++p) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = hw - 1; i > 0; --i)
      std::swap(perm[size_t(i)], perm[rng.below(uint32_t(i + 1))]);
    float shift = rng.normal();
    for (int64_t i = 0; i < hw; ++i)
      v[size_t(p * hw + i)] = shift + 0.05f * float(perm[size_t(i)] - hw / 2);
  }
  return v;
}

// ---- layouts --------------------------------------------------------------------------------

int64_t padded(int64_t c) { return cpu_padded_channels(c); }

int64_t storage_for(const Shape& s, Layout l) {
  if (s.size() == 4 && l == Layout::blocked) return s[0] * padded(s[1]) * s[2] * s[3];
  return shape_numel(s);
}

// Offset of the logical element (n, c, h, w) of a 4-D tensor of shape s in layout l.
int64_t offset4(const Shape& s, Layout l, int64_t n, int64_t c, int64_t h, int64_t w) {
  int64_t C = s[1], H = s[2], W = s[3];
  switch (l) {
    case Layout::plain:
      return ((n * C + c) * H + h) * W + w;
    case Layout::nhwc:
      return ((n * H + h) * W + w) * C + c;
    case Layout::blocked:
      return ((n * (padded(C) / cpu_block_channels()) + c / cpu_block_channels()) * H * W +
              h * W + w) * cpu_block_channels() + c % cpu_block_channels();
  }
  return -1;
}

// Offset of the i-th element in plain (row-major) order.
int64_t offset_of(const Tensor& t, int64_t i) {
  if (t.ndim() != 4) return i;
  const Shape& s = t.shape();
  int64_t w = i % s[3], h = i / s[3] % s[2], c = i / (s[3] * s[2]) % s[1],
          n = i / (s[3] * s[2] * s[1]);
  return offset4(s, t.layout(), n, c, h, w);
}

// A host fp32 tensor of `shape` in `layout` holding `plain` (row-major N, C, H, W values);
// padded channels are zero, as oneDNN requires.
Tensor make_tensor(const Floats& plain, const Shape& shape, Layout layout = Layout::plain) {
  EXPECT_EQ(int64_t(plain.size()), shape_numel(shape));
  Tensor t(shape, DType::f32, Allocator::host(), layout, storage_for(shape, layout));
  float* p = t.data<float>();
  std::fill(p, p + t.storage_elems(), 0.f);
  for (int64_t i = 0; i < shape_numel(shape); ++i) p[offset_of(t, i)] = plain[size_t(i)];
  return t;
}

// `plain` laid out like `like` (layout and padding): a gradient for a layer's output.
inline Tensor make_like(const Floats& plain, const Tensor& like) {
  Tensor t = make_tensor(plain, like.shape(), like.layout());
  EXPECT_EQ(t.storage_elems(), like.storage_elems()) << like.describe();
  return t;
}

// A tensor's canonical values (plain N, C, H, W order) as doubles.
inline Vec values(Backend& be, const Tensor& t) {
  Tensor h = be.to_host(t);
  const float* p = h.data<float>();
  return Vec(p, p + h.numel());
}

Vec to_vec(const Floats& f) { return Vec(f.begin(), f.end()); }
Vec to_vec(const Tensor& host_plain) {
  const float* p = host_plain.data<float>();
  return Vec(p, p + host_plain.numel());
}

inline double dot(const Vec& a, const Floats& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * double(b[i]);
  return s;
}

// Every padded channel of a blocked tensor holds zero (oneDNN's invariant, and the check
// that catches NaN-poisoned memory left unwritten there).
inline ::testing::AssertionResult zero_padding(const Tensor& t) {
  if (t.ndim() != 4 || t.layout() != Layout::blocked || t.dim(1) == padded(t.dim(1)))
    return ::testing::AssertionSuccess();
  const Shape& s = t.shape();
  const float* p = t.data<float>();
  for (int64_t n = 0; n < s[0]; ++n)
    for (int64_t c = s[1]; c < padded(s[1]); ++c)
      for (int64_t h = 0; h < s[2]; ++h)
        for (int64_t w = 0; w < s[3]; ++w) {
          float v = p[offset4(s, t.layout(), n, c, h, w)];
          if (!(v == 0.f))
            return ::testing::AssertionFailure()
                   << "padded channel " << c << " of " << t.describe() << " holds " << v;
        }
  return ::testing::AssertionSuccess();
}

// Returns the host allocator's cached blocks to the system, then leaves `copies` NaN-filled
// blocks of each size (in fp32 elements) in its cache: the next allocations of those sizes
// (the op's outputs) start as NaN, so an element the op leaves unwritten shows.
inline void poison_pool(std::initializer_list<int64_t> elems, int copies = 4) {
  Allocator::host().release_cached();
  std::vector<Tensor> held;
  for (int64_t n : elems)
    for (int i = 0; i < copies; ++i) {
      held.emplace_back(Shape{n}, DType::f32, Allocator::host());
      std::fill(held.back().data<float>(), held.back().data<float>() + n, kNaN);
    }
}

void fill_nan(Tensor& t) { std::fill(t.data<float>(), t.data<float>() + t.storage_elems(), kNaN); }

// Normalized error max |got - want| / max |want| (NaN counts as infinite) below `tol`.
::testing::AssertionResult close(const Vec& got, const Vec& want, double tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  if (scale == 0) scale = 1;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double e = std::fabs(got[i] - want[i]) / scale;
    if (!(e <= worst)) {  // NaN compares false: it becomes the worst
      worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
      at = i;
      if (std::isnan(e)) break;
    }
  }
  if (worst <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "normalized error " << worst << " > " << tol << " at element " << at << ": got "
         << got[at] << ", want " << want[at] << " (scale " << scale << ")";
}

// ---- finite differences ---------------------------------------------------------------------

struct Fd {
  double central = 0, plus = 0, minus = 0;  // central and one-sided slopes
};

// d loss / d v by differences, stepping the fp32 value `v` by +-eps; the step is measured
// after rounding to fp32, and `v` is restored.
inline Fd finite_diff(const std::function<double()>& loss, float& v, double eps) {
  float orig = v;
  float vp = float(orig + eps), vm = float(orig - eps);
  v = vp;
  double lp = loss();
  v = vm;
  double lm = loss();
  v = orig;
  double l0 = loss();
  Fd r;
  r.central = (lp - lm) / (double(vp) - double(vm));
  r.plus = (lp - l0) / (double(vp) - double(orig));
  r.minus = (l0 - lm) / (double(orig) - double(vm));
  return r;
}

inline double rms(const Vec& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s / double(std::max<size_t>(1, v.size())));
}

// The analytic gradient `an` agrees with the central difference within rel * |an| plus
// abs_scale * rel (abs_scale: the gradient tensor's typical magnitude).
inline ::testing::AssertionResult fd_agrees(double fd, double an, double rel, double abs_scale) {
  double tol = rel * (std::fabs(an) + abs_scale);
  if (std::fabs(fd - an) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "finite difference " << fd << " vs analytic " << an << " (tolerance " << tol << ")";
}

// Element indices drawn at random (distinct) from [0, n).
inline std::vector<int64_t> pick(int64_t n, int count, uint32_t stream) {
  Philox rng(777, stream, 0x91c4u);
  std::vector<int64_t> out;
  while (int(out.size()) < std::min<int64_t>(count, n)) {
    int64_t i = rng.below(uint32_t(n));
    if (std::find(out.begin(), out.end(), i) == out.end()) out.push_back(i);
  }
  return out;
}

// The input gradient `dx` (in logical order) agrees with central differences of `loss` (steps of
// 1e-3, within 1e-2) at `count` elements of the input `xt`, drawn from `stream`.
inline void expect_input_grad_as_finite_diffs(const std::function<double()>& loss, Tensor& xt, const Vec& dx,
                                              int count, uint32_t stream) {
  for (int64_t i : pick(xt.numel(), count, stream)) {
    Fd fd = finite_diff(loss, xt.data<float>()[offset_of(xt, i)], 1e-3);
    EXPECT_TRUE(fd_agrees(fd.central, dx[size_t(i)], 1e-2, rms(dx))) << "x[" << i << "]";
  }
}

// ---- float64 references ---------------------------------------------------------------------

struct ConvGeom {
  int n, c, o, h, w, k, s, p;
  int oh() const { return (h + 2 * p - k) / s + 1; }
  int ow() const { return (w + 2 * p - k) / s + 1; }
  Shape x_shape() const { return {n, c, h, w}; }
  Shape w_shape() const { return {o, c, k, k}; }
  Shape y_shape() const { return {n, o, oh(), ow()}; }
};

// Visits every (output, input, weight) index triple of a convolution.
template <typename F>
void conv_visit(const ConvGeom& g, F f) {
  for (int n = 0; n < g.n; ++n)
    for (int o = 0; o < g.o; ++o)
      for (int oy = 0; oy < g.oh(); ++oy)
        for (int ox = 0; ox < g.ow(); ++ox)
          for (int c = 0; c < g.c; ++c)
            for (int ky = 0; ky < g.k; ++ky)
              for (int kx = 0; kx < g.k; ++kx) {
                int iy = oy * g.s - g.p + ky, ix = ox * g.s - g.p + kx;
                if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                size_t yi = ((size_t(n) * g.o + o) * g.oh() + oy) * g.ow() + ox;
                size_t xi = ((size_t(n) * g.c + c) * g.h + iy) * g.w + ix;
                size_t wi = ((size_t(o) * g.c + c) * g.k + ky) * g.k + kx;
                f(yi, xi, wi);
              }
}

inline Vec conv_ref(const Vec& x, const Vec& w, const ConvGeom& g) {
  Vec y(size_t(shape_numel(g.y_shape())), 0.0);
  conv_visit(g, [&](size_t yi, size_t xi, size_t wi) { y[yi] += x[xi] * w[wi]; });
  return y;
}
inline Vec conv_dx_ref(const Vec& dy, const Vec& w, const ConvGeom& g) {
  Vec dx(size_t(shape_numel(g.x_shape())), 0.0);
  conv_visit(g, [&](size_t yi, size_t xi, size_t wi) { dx[xi] += dy[yi] * w[wi]; });
  return dx;
}
inline Vec conv_dw_ref(const Vec& x, const Vec& dy, const ConvGeom& g) {
  Vec dw(size_t(shape_numel(g.w_shape())), 0.0);
  conv_visit(g, [&](size_t yi, size_t xi, size_t wi) { dw[wi] += dy[yi] * x[xi]; });
  return dw;
}

// Batch norm over (N, H, W) per channel; var is the biased batch variance.
struct BnRef {
  Vec y, z, mean, var;  // z: before the optional ReLU
};
BnRef bn_ref(const Vec& x, int N, int C, int HW, const Vec& gamma, const Vec& beta, double eps,
             bool relu) {
  BnRef r;
  r.mean.assign(C, 0.0);
  r.var.assign(C, 0.0);
  r.y.resize(x.size());
  r.z.resize(x.size());
  double m = double(N) * HW;
  for (int c = 0; c < C; ++c) {
    double s = 0;
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < HW; ++i) s += x[(size_t(n) * C + c) * HW + i];
    double mean = s / m, v = 0;
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < HW; ++i) {
        double d = x[(size_t(n) * C + c) * HW + i] - mean;
        v += d * d;
      }
    v /= m;
    r.mean[c] = mean;
    r.var[c] = v;
    double inv = 1.0 / std::sqrt(v + eps);
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < HW; ++i) {
        size_t k = (size_t(n) * C + c) * HW + i;
        r.z[k] = gamma[c] * (x[k] - mean) * inv + beta[c];
        r.y[k] = relu ? std::max(0.0, r.z[k]) : r.z[k];
      }
  }
  return r;
}

inline void bn_bwd_ref(const Vec& x, const Vec& dy, int N, int C, int HW, const Vec& gamma,
                const Vec& beta, double eps, bool relu, Vec& dx, Vec& dgamma, Vec& dbeta) {
  BnRef f = bn_ref(x, N, C, HW, gamma, beta, eps, relu);
  dx.assign(x.size(), 0.0);
  dgamma.assign(C, 0.0);
  dbeta.assign(C, 0.0);
  double m = double(N) * HW;
  for (int c = 0; c < C; ++c) {
    double inv = 1.0 / std::sqrt(f.var[c] + eps), sg = 0, sgx = 0;
    auto g_at = [&](size_t k) { return relu && !(f.z[k] > 0) ? 0.0 : dy[k]; };
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < HW; ++i) {
        size_t k = (size_t(n) * C + c) * HW + i;
        double xh = (x[k] - f.mean[c]) * inv;
        sg += g_at(k);
        sgx += g_at(k) * xh;
      }
    dbeta[c] = sg;
    dgamma[c] = sgx;
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < HW; ++i) {
        size_t k = (size_t(n) * C + c) * HW + i;
        double xh = (x[k] - f.mean[c]) * inv;
        dx[k] = gamma[c] * inv * (g_at(k) - sg / m - xh * sgx / m);
      }
  }
}

// Max pooling (padding never wins); `arg` gets the input index of each output's maximum.
inline Vec maxpool_ref(const Vec& x, int N, int C, int H, int W, int k, int s, int p,
                std::vector<size_t>& arg) {
  int oh = (H + 2 * p - k) / s + 1, ow = (W + 2 * p - k) / s + 1;
  Vec y(size_t(N) * C * oh * ow);
  arg.resize(y.size());
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c)
      for (int oy = 0; oy < oh; ++oy)
        for (int ox = 0; ox < ow; ++ox) {
          double best = -std::numeric_limits<double>::infinity();
          size_t bi = 0;
          for (int ky = 0; ky < k; ++ky)
            for (int kx = 0; kx < k; ++kx) {
              int iy = oy * s - p + ky, ix = ox * s - p + kx;
              if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
              size_t xi = ((size_t(n) * C + c) * H + iy) * W + ix;
              if (x[xi] > best) best = x[xi], bi = xi;
            }
          size_t yi = ((size_t(n) * C + c) * oh + oy) * ow + ox;
          y[yi] = best;
          arg[yi] = bi;
        }
  return y;
}

// Mean softmax cross-entropy with label smoothing and its gradient times grad_scale.
inline double xent_ref(const Vec& z, const std::vector<int32_t>& labels, int N, int M, double smoothing,
                double grad_scale, Vec& dz) {
  double total = 0;
  dz.assign(z.size(), 0.0);
  for (int i = 0; i < N; ++i) {
    double mx = *std::max_element(z.begin() + i * M, z.begin() + (i + 1) * M), se = 0;
    for (int j = 0; j < M; ++j) se += std::exp(z[size_t(i) * M + j] - mx);
    double lse = mx + std::log(se);
    for (int j = 0; j < M; ++j) {
      double q = (j == labels[size_t(i)] ? 1.0 - smoothing : 0.0) + smoothing / M;
      double logp = z[size_t(i) * M + j] - lse;
      total -= q * logp;
      dz[size_t(i) * M + j] = (std::exp(logp) - q) * grad_scale / N;
    }
  }
  return total / N;
}

// Writes `v` into a standalone layer's parameter (host tensor) and poisons its gradient.
inline void set_param(Param& p, const Floats& v) {
  ASSERT_EQ(int64_t(v.size()), p.value.numel()) << p.name;
  std::copy(v.begin(), v.end(), static_cast<float*>(p.value.write_raw()));
  fill_nan(p.grad);
}

inline Context train_ctx(Backend& be) { return Context{be, true, false}; }

}  // namespace
