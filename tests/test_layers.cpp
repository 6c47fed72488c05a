// Layer tests on the CPU backend: every basic layer against a naive float64 reference and
// central finite differences, residual blocks by finite differences, the loss against a
// float64 reference, and gradient checkpointing bitwise against the plain graph.
// Inputs are fresh Philox draws (never zeros); outputs and gradients are NaN-poisoned first.
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
#include "kernels/profiled_backend.h"
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

Floats uniforms(int64_t n, uint32_t stream, float lo, float hi) {
  Philox rng(20240601, stream, 0x0111u);
  Floats v(static_cast<size_t>(n));
  for (auto& x : v) x = lo + (hi - lo) * rng.uniform();
  return v;
}

// Normals pushed away from zero (|x| >= gap), so a ReLU kink is never within a step.
Floats normals_off_zero(int64_t n, uint32_t stream, float gap) {
  Floats v = normals(n, stream);
  for (auto& x : v) x = x >= 0.f ? x + gap : x - gap;
  return v;
}

// Distinct values 0.05 apart per (N, C) plane in random order: no max-pool ties, and a step
// of 1e-3 never changes which element of a window is the largest.
Floats distinct_planes(int64_t planes, int64_t hw, uint32_t stream) {
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
Tensor make_like(const Floats& plain, const Tensor& like) {
  Tensor t = make_tensor(plain, like.shape(), like.layout());
  EXPECT_EQ(t.storage_elems(), like.storage_elems()) << like.describe();
  return t;
}

// A tensor's canonical values (plain N, C, H, W order) as doubles.
Vec values(Backend& be, const Tensor& t) {
  Tensor h = be.to_host(t);
  const float* p = h.data<float>();
  return Vec(p, p + h.numel());
}

Vec to_vec(const Floats& f) { return Vec(f.begin(), f.end()); }
Vec to_vec(const Tensor& host_plain) {
  const float* p = host_plain.data<float>();
  return Vec(p, p + host_plain.numel());
}

double dot(const Vec& a, const Floats& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * double(b[i]);
  return s;
}

// Every padded channel of a blocked tensor holds zero (oneDNN's invariant, and the check
// that catches NaN-poisoned memory left unwritten there).
::testing::AssertionResult zero_padding(const Tensor& t) {
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
void poison_pool(std::initializer_list<int64_t> elems, int copies = 4) {
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
Fd finite_diff(const std::function<double()>& loss, float& v, double eps) {
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

double rms(const Vec& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s / double(std::max<size_t>(1, v.size())));
}

// The analytic gradient `an` agrees with the central difference within rel * |an| plus
// abs_scale * rel (abs_scale: the gradient tensor's typical magnitude).
::testing::AssertionResult fd_agrees(double fd, double an, double rel, double abs_scale) {
  double tol = rel * (std::fabs(an) + abs_scale);
  if (std::fabs(fd - an) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "finite difference " << fd << " vs analytic " << an << " (tolerance " << tol << ")";
}

// Element indices drawn at random (distinct) from [0, n).
std::vector<int64_t> pick(int64_t n, int count, uint32_t stream) {
  Philox rng(777, stream, 0x91c4u);
  std::vector<int64_t> out;
  while (int(out.size()) < std::min<int64_t>(count, n)) {
    int64_t i = rng.below(uint32_t(n));
    if (std::find(out.begin(), out.end(), i) == out.end()) out.push_back(i);
  }
  return out;
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

Vec conv_ref(const Vec& x, const Vec& w, const ConvGeom& g) {
  Vec y(size_t(shape_numel(g.y_shape())), 0.0);
  conv_visit(g, [&](size_t yi, size_t xi, size_t wi) { y[yi] += x[xi] * w[wi]; });
  return y;
}
Vec conv_dx_ref(const Vec& dy, const Vec& w, const ConvGeom& g) {
  Vec dx(size_t(shape_numel(g.x_shape())), 0.0);
  conv_visit(g, [&](size_t yi, size_t xi, size_t wi) { dx[xi] += dy[yi] * w[wi]; });
  return dx;
}
Vec conv_dw_ref(const Vec& x, const Vec& dy, const ConvGeom& g) {
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

void bn_bwd_ref(const Vec& x, const Vec& dy, int N, int C, int HW, const Vec& gamma,
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
Vec maxpool_ref(const Vec& x, int N, int C, int H, int W, int k, int s, int p,
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
double xent_ref(const Vec& z, const std::vector<int32_t>& labels, int N, int M, double smoothing,
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
void set_param(Param& p, const Floats& v) {
  ASSERT_EQ(int64_t(v.size()), p.value.numel()) << p.name;
  std::copy(v.begin(), v.end(), static_cast<float*>(p.value.write_raw()));
  fill_nan(p.grad);
}

Context train_ctx(Backend& be) { return Context{be, true, false}; }

// ============================================================================================
// Helper self-check: our layout helper agrees with the backend's reorders.
// ============================================================================================

TEST(LayoutHelper, MakeTensorRoundTripsThroughTheBackend) {
  auto be = cpu_backend();
  Shape s{2, 5, 3, 4};
  Floats v = normals(shape_numel(s), 1);
  for (Layout l : {Layout::plain, Layout::nhwc, Layout::blocked}) {
    Tensor t = make_tensor(v, s, l);
    EXPECT_TRUE(close(values(*be, t), to_vec(v), 0.0)) << layout_name(l);
  }
}

// ============================================================================================
// 1, 2. Conv2d: forward, dx, dw against the float64 reference, then finite differences.
// ============================================================================================

struct ConvCase {
  const char* name;
  ConvGeom g;
  Layout layout;
};

class ConvVsReference : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ConvVsReference, ForwardAndBackwardMatchFloat64) {
  const ConvCase& cc = GetParam();
  const ConvGeom& g = cc.g;
  auto be = cpu_backend();
  Conv2d conv("conv", g.c, g.o, g.k, g.s, g.p);
  Floats x = normals(shape_numel(g.x_shape()), 10);
  Floats w = normals(shape_numel(g.w_shape()), 11, 1.f / std::sqrt(float(g.c * g.k * g.k)));
  set_param(conv.weight(), w);
  Tensor xt = make_tensor(x, g.x_shape(), cc.layout);
  Context ctx = train_ctx(*be);

  int64_t y_store = storage_for(g.y_shape(), Layout::blocked);
  poison_pool({y_store, xt.storage_elems()});
  Tensor y = conv.forward(xt, ctx);
  ASSERT_EQ(y.shape(), g.y_shape());
  EXPECT_TRUE(zero_padding(y));
  EXPECT_TRUE(close(values(*be, y), conv_ref(to_vec(x), to_vec(w), g), 1e-4)) << "forward";

  Floats r = normals(shape_numel(g.y_shape()), 12);
  Tensor dy = make_like(r, y);
  poison_pool({y_store, xt.storage_elems(), storage_for(g.x_shape(), Layout::blocked)});
  Tensor dx = conv.backward(dy, ctx);
  ASSERT_TRUE(dx.defined());
  ASSERT_EQ(dx.shape(), g.x_shape());
  EXPECT_TRUE(zero_padding(dx));
  EXPECT_TRUE(close(values(*be, dx), conv_dx_ref(to_vec(r), to_vec(w), g), 1e-4)) << "dx";
  EXPECT_TRUE(close(to_vec(conv.weight().grad), conv_dw_ref(to_vec(x), to_vec(r), g), 1e-4))
      << "dw";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ConvVsReference,
    ::testing::Values(
        // {name, {n, c, o, h, w, k, stride, pad}, input layout}
        ConvCase{"k3s1p1_3to5_nhwc", {1, 3, 5, 7, 9, 3, 1, 1}, Layout::nhwc},
        ConvCase{"k7s2p3_3to5_nhwc_n3", {3, 3, 5, 13, 13, 7, 2, 3}, Layout::nhwc},
        ConvCase{"k3s2p1_3to16_plain", {2, 3, 16, 9, 9, 3, 2, 1}, Layout::plain},
        ConvCase{"k3s2p1_16to24_blocked_n3", {3, 16, 24, 7, 9, 3, 2, 1}, Layout::blocked},
        ConvCase{"k1s1p0_16to24_blocked", {1, 16, 24, 13, 13, 1, 1, 0}, Layout::blocked},
        ConvCase{"k1s2p0_5to7_blocked_n3", {3, 5, 7, 9, 7, 1, 2, 0}, Layout::blocked},
        ConvCase{"k3s1p0_20to16_blocked", {2, 20, 16, 5, 5, 3, 1, 0}, Layout::blocked},
        ConvCase{"k7s2p3_5to24_blocked", {2, 5, 24, 11, 9, 7, 2, 3}, Layout::blocked},
        ConvCase{"k3s1p1_24to5_blocked_n3", {3, 24, 5, 13, 13, 3, 1, 1}, Layout::blocked}),
    [](const ::testing::TestParamInfo<ConvCase>& i) { return std::string(i.param.name); });

TEST(Conv2d, BlockedInputFromAPriorConvolution) {
  // The blocked input a real network feeds: the output of a 1x1 convolution of an NHWC image.
  auto be = cpu_backend();
  ConvGeom g1{2, 3, 5, 9, 7, 1, 1, 0}, g2{2, 5, 6, 9, 7, 3, 2, 1};
  Conv2d c1("c1", 3, 5, 1, 1, 0), c2("c2", 5, 6, 3, 2, 1);
  Floats x = normals(shape_numel(g1.x_shape()), 20);
  Floats w1 = normals(shape_numel(g1.w_shape()), 21, 0.5f),
         w2 = normals(shape_numel(g2.w_shape()), 22, 0.2f);
  set_param(c1.weight(), w1);
  set_param(c2.weight(), w2);
  Context ctx = train_ctx(*be);
  Tensor h = c1.forward(make_tensor(x, g1.x_shape(), Layout::nhwc), ctx);
  ASSERT_EQ(h.layout(), Layout::blocked);
  Tensor y = c2.forward(h, ctx);
  Vec href = conv_ref(to_vec(x), to_vec(w1), g1);
  Vec hval = values(*be, h);
  EXPECT_TRUE(close(values(*be, y), conv_ref(hval, to_vec(w2), g2), 1e-4));
  EXPECT_TRUE(close(values(*be, y), conv_ref(href, to_vec(w2), g2), 1e-4));
}

TEST(Conv2d, NoInputGradientWhenToldSoButWeightGradientWritten) {
  auto be = cpu_backend();
  ConvGeom g{2, 3, 5, 6, 6, 3, 1, 1};
  Conv2d conv("conv", 3, 5, 3, 1, 1);
  Floats x = normals(shape_numel(g.x_shape()), 30), w = normals(shape_numel(g.w_shape()), 31, 0.3f);
  set_param(conv.weight(), w);
  conv.set_needs_input_grad(false);
  Context ctx = train_ctx(*be);
  Tensor y = conv.forward(make_tensor(x, g.x_shape(), Layout::nhwc), ctx);
  Floats r = normals(y.numel(), 32);
  Tensor dx = conv.backward(make_like(r, y), ctx);
  EXPECT_FALSE(dx.defined());
  EXPECT_TRUE(close(to_vec(conv.weight().grad), conv_dw_ref(to_vec(x), to_vec(r), g), 1e-4));
}

TEST(Conv2d, RejectsWrongChannelCount) {
  auto be = cpu_backend();
  Conv2d conv("conv", 4, 5, 3, 1, 1);
  Context ctx = train_ctx(*be);
  EXPECT_THROW(
      conv.forward(make_tensor(normals(2 * 3 * 5 * 5, 33), {2, 3, 5, 5}, Layout::nhwc), ctx),
      Error);
}

class ConvFiniteDiff : public ::testing::TestWithParam<Layout> {};

TEST_P(ConvFiniteDiff, InputAndWeightGradients) {
  auto be = cpu_backend();
  ConvGeom g{2, 5, 6, 6, 7, 3, 2, 1};
  Conv2d conv("conv", g.c, g.o, g.k, g.s, g.p);
  Floats x = normals(shape_numel(g.x_shape()), 40);
  Floats w = normals(shape_numel(g.w_shape()), 41, 0.3f);
  set_param(conv.weight(), w);
  Tensor xt = make_tensor(x, g.x_shape(), GetParam());
  Context ctx = train_ctx(*be);
  Tensor y = conv.forward(xt, ctx);
  Floats r = normals(y.numel(), 42);
  Vec dx = values(*be, conv.backward(make_like(r, y), ctx));
  Vec dw = to_vec(conv.weight().grad);
  auto loss = [&] {
    conv.weight().value.mark_written();  // finite_diff moved an input or a weight
    return dot(values(*be, conv.forward(xt, ctx)), r);
  };
  for (int64_t i : pick(int64_t(x.size()), 8, 43)) {
    Fd fd = finite_diff(loss, xt.data<float>()[offset_of(xt, i)], 1e-3);
    EXPECT_TRUE(fd_agrees(fd.central, dx[size_t(i)], 1e-2, rms(dx))) << "x[" << i << "]";
  }
  float* wv = conv.weight().value.data<float>();
  for (int64_t i : pick(int64_t(w.size()), 8, 44)) {
    Fd fd = finite_diff(loss, wv[i], 1e-3);
    EXPECT_TRUE(fd_agrees(fd.central, dw[size_t(i)], 1e-2, rms(dw))) << "w[" << i << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ConvFiniteDiff, ::testing::Values(Layout::nhwc, Layout::blocked),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           return std::string(layout_name(i.param));
                         });

// ============================================================================================
// 3. BatchNorm2d: training forward, running statistics, eval, backward, finite differences.
// ============================================================================================

struct BnSetup {
  int N = 3, C = 20, H = 4, W = 5;  // C spans two channel blocks, the second padded
  Shape shape() const { return {N, C, H, W}; }
  int hw() const { return H * W; }
  int64_t numel() const { return int64_t(N) * C * H * W; }
};

// An input whose channels have different means and spreads.
Floats bn_input(const BnSetup& s, uint32_t stream) {
  Floats x = normals(s.numel(), stream);
  Floats shift = normals(s.C, stream + 1000, 2.f), scale = uniforms(s.C, stream + 2000, 0.5f, 2.f);
  for (int64_t i = 0; i < s.numel(); ++i) {
    int c = int(i / s.hw() % s.C);
    x[size_t(i)] = shift[size_t(c)] + scale[size_t(c)] * x[size_t(i)];
  }
  return x;
}

// Beta per channel put in the middle of the widest gap between normalized values, so that
// a fused ReLU's kink lies far from every element (needed by the finite differences).
Floats beta_between_values(const BnSetup& s, const Floats& x, const Floats& gamma, double eps,
                           double* margin) {
  Vec zero(s.C, 0.0);
  BnRef f = bn_ref(to_vec(x), s.N, s.C, s.hw(), to_vec(gamma), zero, eps, false);
  Floats beta(size_t(s.C));
  *margin = 1e9;
  for (int c = 0; c < s.C; ++c) {
    Vec v;
    for (int n = 0; n < s.N; ++n)
      for (int i = 0; i < s.hw(); ++i) v.push_back(f.z[(size_t(n) * s.C + c) * s.hw() + i]);
    std::sort(v.begin(), v.end());
    size_t lo = v.size() / 4, best = lo;
    for (size_t i = lo; i + 1 < 3 * v.size() / 4; ++i)
      if (v[i + 1] - v[i] > v[best + 1] - v[best]) best = i;
    beta[size_t(c)] = float(-(v[best] + v[best + 1]) / 2);
    *margin = std::min(*margin, (v[best + 1] - v[best]) / 2);
  }
  return beta;
}

class BatchNormTest : public ::testing::TestWithParam<bool> {};  // fused ReLU

TEST_P(BatchNormTest, TrainingForwardAndBackwardMatchFloat64) {
  bool relu = GetParam();
  BnSetup s;
  auto be = cpu_backend();
  BatchNorm2d bn("bn", s.C, relu);
  Floats x = bn_input(s, 50);
  Floats gamma = uniforms(s.C, 51, 0.5f, 1.5f), beta = normals(s.C, 52, 0.5f);
  set_param(bn.gamma(), gamma);
  set_param(bn.beta(), beta);
  Tensor xt = make_tensor(x, s.shape(), Layout::blocked);
  Context ctx = train_ctx(*be);
  poison_pool({xt.storage_elems()});
  Tensor y = bn.forward(xt, ctx);
  ASSERT_EQ(y.shape(), s.shape());
  EXPECT_TRUE(zero_padding(y));
  BnRef ref = bn_ref(to_vec(x), s.N, s.C, s.hw(), to_vec(gamma), to_vec(beta), 1e-5, relu);
  EXPECT_TRUE(close(values(*be, y), ref.y, 1e-4)) << "forward";

  Floats r = normals(s.numel(), 53);
  poison_pool({xt.storage_elems()});
  Tensor dx = bn.backward(make_like(r, y), ctx);
  EXPECT_TRUE(zero_padding(dx));
  Vec rdx, rdg, rdb;
  bn_bwd_ref(to_vec(x), to_vec(r), s.N, s.C, s.hw(), to_vec(gamma), to_vec(beta), 1e-5, relu, rdx,
             rdg, rdb);
  EXPECT_TRUE(close(values(*be, dx), rdx, 1e-4)) << "dx";
  EXPECT_TRUE(close(to_vec(bn.gamma().grad), rdg, 1e-4)) << "dgamma";
  EXPECT_TRUE(close(to_vec(bn.beta().grad), rdb, 1e-4)) << "dbeta";
}

TEST_P(BatchNormTest, NhwcInputMatchesFloat64) {
  bool relu = GetParam();
  BnSetup s;
  s.C = 5;
  auto be = cpu_backend();
  BatchNorm2d bn("bn", s.C, relu);
  Floats x = bn_input(s, 60);
  Floats gamma = uniforms(s.C, 61, 0.5f, 1.5f), beta = normals(s.C, 62, 0.5f);
  set_param(bn.gamma(), gamma);
  set_param(bn.beta(), beta);
  Context ctx = train_ctx(*be);
  Tensor y = bn.forward(make_tensor(x, s.shape(), Layout::nhwc), ctx);
  EXPECT_TRUE(close(values(*be, y),
                    bn_ref(to_vec(x), s.N, s.C, s.hw(), to_vec(gamma), to_vec(beta), 1e-5, relu).y,
                    1e-4));
  Floats r = normals(s.numel(), 63);
  Tensor dx = bn.backward(make_like(r, y), ctx);
  Vec rdx, rdg, rdb;
  bn_bwd_ref(to_vec(x), to_vec(r), s.N, s.C, s.hw(), to_vec(gamma), to_vec(beta), 1e-5, relu, rdx,
             rdg, rdb);
  EXPECT_TRUE(close(values(*be, dx), rdx, 1e-4)) << "dx";
  EXPECT_TRUE(close(to_vec(bn.gamma().grad), rdg, 1e-4)) << "dgamma";
  EXPECT_TRUE(close(to_vec(bn.beta().grad), rdb, 1e-4)) << "dbeta";
}

TEST_P(BatchNormTest, RunningStatisticsAndEvalMode) {
  bool relu = GetParam();
  BnSetup s;
  auto be = cpu_backend();
  BatchNorm2d bn("bn", s.C, relu);
  Floats gamma = uniforms(s.C, 70, 0.5f, 1.5f), beta = normals(s.C, 71, 0.5f);
  set_param(bn.gamma(), gamma);
  set_param(bn.beta(), beta);
  Context ctx = train_ctx(*be);
  double n = double(s.N) * s.hw(), unbias = n / (n - 1);
  Vec rm(s.C, 0.0), rv(s.C, 1.0);  // fresh running statistics: mean 0, variance 1
  for (int step = 0; step < 2; ++step) {
    Floats x = bn_input(s, 72 + step);
    bn.forward(make_tensor(x, s.shape(), Layout::blocked), ctx);
    BnRef ref = bn_ref(to_vec(x), s.N, s.C, s.hw(), to_vec(gamma), to_vec(beta), 1e-5, relu);
    for (int c = 0; c < s.C; ++c) {
      rm[size_t(c)] = 0.9 * rm[size_t(c)] + 0.1 * ref.mean[size_t(c)];
      rv[size_t(c)] = 0.9 * rv[size_t(c)] + 0.1 * ref.var[size_t(c)] * unbias;
    }
    EXPECT_TRUE(close(to_vec(bn.running_mean().value), rm, 1e-5)) << "running mean, step " << step;
    EXPECT_TRUE(close(to_vec(bn.running_var().value), rv, 1e-5)) << "running var, step " << step;
  }
  // A checkpoint replay recomputes the batch statistics without counting them again.
  Vec rm_before = to_vec(bn.running_mean().value), rv_before = to_vec(bn.running_var().value);
  Context replay{*be, true, true};
  bn.forward(make_tensor(bn_input(s, 80), s.shape(), Layout::blocked), replay);
  EXPECT_EQ(to_vec(bn.running_mean().value), rm_before);
  EXPECT_EQ(to_vec(bn.running_var().value), rv_before);

  // Eval: normalized with the running statistics, which stay as they are.
  Floats x = bn_input(s, 81);
  Context eval{*be, false, false};
  poison_pool({storage_for(s.shape(), Layout::blocked)});
  Tensor y = bn.forward(make_tensor(x, s.shape(), Layout::blocked), eval);
  EXPECT_TRUE(zero_padding(y));
  Vec want(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    size_t c = i / size_t(s.hw()) % size_t(s.C);
    double z = gamma[c] * (x[i] - rm[c]) / std::sqrt(rv[c] + 1e-5) + beta[c];
    want[i] = relu ? std::max(0.0, z) : z;
  }
  EXPECT_TRUE(close(values(*be, y), want, 1e-4)) << "eval forward";
  EXPECT_EQ(to_vec(bn.running_mean().value), rm_before);
  EXPECT_EQ(to_vec(bn.running_var().value), rv_before);
}

TEST_P(BatchNormTest, FiniteDifferences) {
  bool relu = GetParam();
  BnSetup s;
  s.C = 5;
  auto be = cpu_backend();
  BatchNorm2d bn("bn", s.C, relu);
  Floats x = bn_input(s, 90);
  Floats gamma = uniforms(s.C, 91, 0.5f, 1.5f), beta = normals(s.C, 92, 0.5f);
  if (relu) {
    double margin;
    beta = beta_between_values(s, x, gamma, 1e-5, &margin);
    ASSERT_GT(margin, 0.01) << "input leaves no room around the ReLU kink";
  }
  set_param(bn.gamma(), gamma);
  set_param(bn.beta(), beta);
  Tensor xt = make_tensor(x, s.shape(), Layout::blocked);
  Context ctx = train_ctx(*be);
  Tensor y = bn.forward(xt, ctx);
  Floats r = normals(s.numel(), 93);
  Vec dx = values(*be, bn.backward(make_like(r, y), ctx));
  Vec dg = to_vec(bn.gamma().grad), db = to_vec(bn.beta().grad);
  auto loss = [&] { return dot(values(*be, bn.forward(xt, ctx)), r); };
  for (int64_t i : pick(s.numel(), 8, 94)) {
    Fd fd = finite_diff(loss, xt.data<float>()[offset_of(xt, i)], 1e-3);
    EXPECT_TRUE(fd_agrees(fd.central, dx[size_t(i)], 1e-2, rms(dx))) << "x[" << i << "]";
  }
  for (int c = 0; c < s.C; ++c) {
    Fd fg = finite_diff(loss, bn.gamma().value.data<float>()[c], 1e-3);
    EXPECT_TRUE(fd_agrees(fg.central, dg[size_t(c)], 1e-2, rms(dg))) << "gamma[" << c << "]";
    Fd fb = finite_diff(loss, bn.beta().value.data<float>()[c], 1e-3);
    EXPECT_TRUE(fd_agrees(fb.central, db[size_t(c)], 1e-2, rms(db))) << "beta[" << c << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(Relu, BatchNormTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "fused_relu" : "plain");
                         });

// ============================================================================================
// 4. ReLU, MaxPool2d, GlobalAvgPool, Linear.
// ============================================================================================

TEST(ReLU, ForwardBackwardAndFiniteDifferences) {
  auto be = cpu_backend();
  Shape s{2, 5, 3, 7};
  Floats x = normals_off_zero(shape_numel(s), 100, 0.1f);
  ReLU relu("relu");
  Tensor xt = make_tensor(x, s, Layout::blocked);
  Context ctx = train_ctx(*be);
  poison_pool({xt.storage_elems()});
  Tensor y = relu.forward(xt, ctx);
  EXPECT_TRUE(zero_padding(y));
  Vec want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = std::max(0.0, double(x[i]));
  EXPECT_TRUE(close(values(*be, y), want, 0.0));
  Floats r = normals(shape_numel(s), 101);
  poison_pool({xt.storage_elems()});
  Tensor dx = relu.backward(make_like(r, y), ctx);
  EXPECT_TRUE(zero_padding(dx));
  Vec dwant(x.size());
  for (size_t i = 0; i < x.size(); ++i) dwant[i] = x[i] > 0 ? r[i] : 0.0;
  Vec got = values(*be, dx);
  EXPECT_TRUE(close(got, dwant, 0.0));
  auto loss = [&] { return dot(values(*be, relu.forward(xt, ctx)), r); };
  for (int64_t i : pick(shape_numel(s), 8, 102)) {
    Fd fd = finite_diff(loss, xt.data<float>()[offset_of(xt, i)], 1e-3);
    EXPECT_TRUE(fd_agrees(fd.central, got[size_t(i)], 1e-2, rms(got))) << "x[" << i << "]";
  }
}

struct PoolCase {
  const char* name;
  int n, c, h, w, k, s, p;
  Layout layout;
};

class MaxPoolTest : public ::testing::TestWithParam<PoolCase> {};

TEST_P(MaxPoolTest, ForwardBackwardAndFiniteDifferences) {
  const PoolCase& pc = GetParam();
  auto be = cpu_backend();
  Shape s{pc.n, pc.c, pc.h, pc.w};
  Floats x = distinct_planes(int64_t(pc.n) * pc.c, int64_t(pc.h) * pc.w, 110);
  MaxPool2d pool("pool", pc.k, pc.s, pc.p);
  Tensor xt = make_tensor(x, s, pc.layout);
  Context ctx = train_ctx(*be);
  std::vector<size_t> arg;
  Vec want = maxpool_ref(to_vec(x), pc.n, pc.c, pc.h, pc.w, pc.k, pc.s, pc.p, arg);
  Shape ys{pc.n, pc.c, (pc.h + 2 * pc.p - pc.k) / pc.s + 1, (pc.w + 2 * pc.p - pc.k) / pc.s + 1};
  poison_pool({storage_for(ys, Layout::blocked)});
  Tensor y = pool.forward(xt, ctx);
  ASSERT_EQ(y.shape(), ys);
  EXPECT_TRUE(zero_padding(y));
  EXPECT_TRUE(close(values(*be, y), want, 0.0)) << "forward";

  Floats r = normals(shape_numel(ys), 111);
  Vec dwant(x.size(), 0.0);
  for (size_t i = 0; i < r.size(); ++i) dwant[arg[i]] += r[i];
  poison_pool({storage_for(s, Layout::blocked), xt.storage_elems()});
  Tensor dx = pool.backward(make_like(r, y), ctx);
  ASSERT_EQ(dx.shape(), s);
  EXPECT_TRUE(zero_padding(dx));
  Vec got = values(*be, dx);
  EXPECT_TRUE(close(got, dwant, 1e-6)) << "dx";

  auto loss = [&] { return dot(values(*be, pool.forward(xt, ctx)), r); };
  for (int64_t i : pick(shape_numel(s), 10, 112)) {
    Fd fd = finite_diff(loss, xt.data<float>()[offset_of(xt, i)], 1e-3);
    EXPECT_TRUE(fd_agrees(fd.central, got[size_t(i)], 1e-2, rms(got))) << "x[" << i << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Windows, MaxPoolTest,
    ::testing::Values(PoolCase{"k3s2p1_7x9_blocked", 2, 5, 7, 9, 3, 2, 1, Layout::blocked},
                      PoolCase{"k3s2p1_8x8_c20_blocked", 1, 20, 8, 8, 3, 2, 1, Layout::blocked},
                      PoolCase{"k2s2p0_8x6_blocked", 2, 5, 8, 6, 2, 2, 0, Layout::blocked},
                      PoolCase{"k2s2p0_7x9_blocked", 3, 16, 7, 9, 2, 2, 0, Layout::blocked},
                      PoolCase{"k3s2p1_7x9_nhwc", 2, 5, 7, 9, 3, 2, 1, Layout::nhwc},
                      PoolCase{"k2s2p0_7x9_plain", 2, 5, 7, 9, 2, 2, 0, Layout::plain}),
    [](const ::testing::TestParamInfo<PoolCase>& i) { return std::string(i.param.name); });

class GlobalAvgPoolTest : public ::testing::TestWithParam<Layout> {};

TEST_P(GlobalAvgPoolTest, ForwardBackwardAndFiniteDifferences) {
  auto be = cpu_backend();
  int N = 3, C = 5, H = 3, W = 5;
  Shape s{N, C, H, W};
  Floats x = normals(shape_numel(s), 120);
  GlobalAvgPool gap("avgpool");
  Tensor xt = make_tensor(x, s, GetParam());
  Context ctx = train_ctx(*be);
  poison_pool({int64_t(N) * C});
  Tensor y = gap.forward(xt, ctx);
  ASSERT_EQ(y.shape(), (Shape{N, C}));
  Vec want(size_t(N) * C, 0.0);
  for (size_t i = 0; i < x.size(); ++i) want[i / size_t(H * W)] += double(x[i]) / (H * W);
  EXPECT_TRUE(close(values(*be, y), want, 1e-5)) << "forward";
  Floats r = normals(int64_t(N) * C, 121);
  poison_pool({xt.storage_elems()});
  Tensor dx = gap.backward(make_tensor(r, {N, C}), ctx);
  EXPECT_EQ(dx.layout(), xt.layout());
  EXPECT_TRUE(zero_padding(dx));
  Vec dwant(x.size());
  for (size_t i = 0; i < x.size(); ++i) dwant[i] = double(r[i / size_t(H * W)]) / (H * W);
  Vec got = values(*be, dx);
  EXPECT_TRUE(close(got, dwant, 1e-6)) << "dx";
  auto loss = [&] { return dot(values(*be, gap.forward(xt, ctx)), r); };
  for (int64_t i : pick(shape_numel(s), 6, 122)) {
    Fd fd = finite_diff(loss, xt.data<float>()[offset_of(xt, i)], 1e-3);
    EXPECT_TRUE(fd_agrees(fd.central, got[size_t(i)], 1e-2, rms(got))) << "x[" << i << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, GlobalAvgPoolTest,
                         ::testing::Values(Layout::blocked, Layout::nhwc, Layout::plain),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           return std::string(layout_name(i.param));
                         });

TEST(Linear, ForwardBackwardAndFiniteDifferences) {
  auto be = cpu_backend();
  int N = 3, K = 7, M = 5;
  Linear fc("fc", K, M);
  Floats x = normals(int64_t(N) * K, 130), w = normals(int64_t(M) * K, 131, 0.4f),
         b = normals(M, 132, 0.5f);
  set_param(fc.weight(), w);
  set_param(fc.bias(), b);
  Tensor xt = make_tensor(x, {N, K});
  Context ctx = train_ctx(*be);
  poison_pool({int64_t(N) * M});
  Tensor y = fc.forward(xt, ctx);
  Vec want(size_t(N) * M);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < M; ++j) {
      double s = b[size_t(j)];
      for (int k = 0; k < K; ++k) s += double(x[size_t(i * K + k)]) * w[size_t(j * K + k)];
      want[size_t(i * M + j)] = s;
    }
  EXPECT_TRUE(close(values(*be, y), want, 1e-5)) << "forward";

  Floats r = normals(int64_t(N) * M, 133);
  poison_pool({int64_t(N) * K});
  Tensor dxt = fc.backward(make_tensor(r, {N, M}), ctx);
  Vec dx(size_t(N) * K, 0.0), dw(size_t(M) * K, 0.0), db(size_t(M), 0.0);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < M; ++j) {
      double g = r[size_t(i * M + j)];
      db[size_t(j)] += g;
      for (int k = 0; k < K; ++k) {
        dx[size_t(i * K + k)] += g * w[size_t(j * K + k)];
        dw[size_t(j * K + k)] += g * x[size_t(i * K + k)];
      }
    }
  Vec gdx = values(*be, dxt), gdw = to_vec(fc.weight().grad), gdb = to_vec(fc.bias().grad);
  EXPECT_TRUE(close(gdx, dx, 1e-5)) << "dx";
  EXPECT_TRUE(close(gdw, dw, 1e-5)) << "dw";
  EXPECT_TRUE(close(gdb, db, 1e-5)) << "db";

  auto loss = [&] { return dot(values(*be, fc.forward(xt, ctx)), r); };
  for (int64_t i : pick(int64_t(N) * K, 5, 134)) {
    Fd fd = finite_diff(loss, xt.data<float>()[i], 1e-3);
    EXPECT_TRUE(fd_agrees(fd.central, gdx[size_t(i)], 1e-2, rms(gdx))) << "x[" << i << "]";
  }
  for (int64_t i : pick(int64_t(M) * K, 5, 135)) {
    Fd fd = finite_diff(loss, fc.weight().value.data<float>()[i], 1e-3);
    EXPECT_TRUE(fd_agrees(fd.central, gdw[size_t(i)], 1e-2, rms(gdw))) << "w[" << i << "]";
  }
  for (int j = 0; j < M; ++j) {
    Fd fd = finite_diff(loss, fc.bias().value.data<float>()[j], 1e-3);
    EXPECT_TRUE(fd_agrees(fd.central, gdb[size_t(j)], 1e-2, rms(gdb))) << "b[" << j << "]";
  }

  // Without an input gradient the parameter gradients are still written.
  fc.set_needs_input_grad(false);
  fill_nan(fc.weight().grad);
  fill_nan(fc.bias().grad);
  fc.forward(xt, ctx);
  EXPECT_FALSE(fc.backward(make_tensor(r, {N, M}), ctx).defined());
  EXPECT_TRUE(close(to_vec(fc.weight().grad), dw, 1e-5));
  EXPECT_TRUE(close(to_vec(fc.bias().grad), db, 1e-5));
}

// ============================================================================================
// 5. Residual blocks: finite differences of the input and of parameters.
// ============================================================================================

// Random values for every parameter of a standalone layer graph (gradients poisoned).
void randomize_params(Layer& l, uint32_t stream) {
  std::vector<Param*> ps;
  l.collect_params(ps);
  for (size_t i = 0; i < ps.size(); ++i) {
    Param* p = ps[i];
    int64_t n = p->value.numel();
    uint32_t st = stream + uint32_t(i);
    switch (p->init) {
      case Param::Init::kaiming_fan_out:
        set_param(*p, normals(n, st, std::sqrt(2.f / float(p->fan))));
        break;
      case Param::Init::uniform_fan_in:
        set_param(*p, uniforms(n, st, -0.5f, 0.5f));
        break;
      case Param::Init::ones:
        set_param(*p, uniforms(n, st, 0.5f, 1.5f));
        break;
      case Param::Init::zeros:
        set_param(*p, normals(n, st, 0.3f));
        break;
    }
  }
}

// A block of resnet20 as build_resnet makes it: stage 0..2, block index.
std::unique_ptr<Layer> resnet20_block(int stage, int index) {
  ResNetOptions o;
  o.arch = "resnet20";
  auto net = build_resnet(o);
  auto layers = net->release();  // conv1, bn1, layer1, layer2, layer3, avgpool, fc
  auto* st = dynamic_cast<Sequential*>(layers.at(size_t(2 + stage)).get());
  if (!st) return nullptr;
  auto blocks = st->release();
  return std::move(blocks.at(size_t(index)));
}

// A torchvision Bottleneck (v1.5, stride on the 3x3) assembled as resnet.cpp does it.
std::unique_ptr<Layer> bottleneck(int in, int planes, int stride) {
  auto main = std::make_unique<Sequential>("b");
  main->emplace<Conv2d>("b.conv1", in, planes, 1, 1, 0);
  main->emplace<BatchNorm2d>("b.bn1", planes, true);
  main->emplace<Conv2d>("b.conv2", planes, planes, 3, stride, 1);
  main->emplace<BatchNorm2d>("b.bn2", planes, true);
  main->emplace<Conv2d>("b.conv3", planes, planes * 4, 1, 1, 0);
  main->emplace<BatchNorm2d>("b.bn3", planes * 4, false);
  auto sc = std::make_unique<Sequential>("b.downsample");
  sc->emplace<Conv2d>("b.downsample.0", in, planes * 4, 1, stride, 0);
  sc->emplace<BatchNorm2d>("b.downsample.1", planes * 4, false);
  return std::make_unique<Residual>("b", std::move(main), std::move(sc));
}

struct BlockCase {
  const char* name;
  std::function<std::unique_ptr<Layer>()> make;
  int n, c, h, w;
};

class ResidualBlockTest : public ::testing::TestWithParam<BlockCase> {};

TEST_P(ResidualBlockTest, FiniteDifferencesOfInputAndParameters) {
  const BlockCase& bc = GetParam();
  auto be = cpu_backend();
  std::unique_ptr<Layer> block = bc.make();
  ASSERT_TRUE(block);
  randomize_params(*block, 140);
  std::vector<Param*> ps;
  block->collect_params(ps);
  Shape s{bc.n, bc.c, bc.h, bc.w};
  Tensor xt = make_tensor(normals(shape_numel(s), 141), s, Layout::blocked);
  Context ctx = train_ctx(*be);
  Tensor y = block->forward(xt, ctx);
  Floats r = normals(y.numel(), 142);
  poison_pool({xt.storage_elems()});
  Tensor dxt = block->backward(make_like(r, y), ctx);
  ASSERT_TRUE(dxt.defined());
  EXPECT_TRUE(zero_padding(dxt));
  Vec dx = values(*be, dxt);
  auto loss = [&] {
    for (auto* p : ps) p->value.mark_written();  // finite_diff moved a weight
    return dot(values(*be, block->forward(xt, ctx)), r);
  };
  // A step may cross a ReLU kink (the one-sided slopes then disagree): such elements are
  // skipped, but most must be checked. Steps: 1e-2 for an input element (it moves few
  // outputs, so fp32 rounding of the loss dominates a smaller step), 1e-3 for a parameter
  // (it moves a whole channel, so a larger step crosses kinks).
  int checked = 0, tried = 0;
  auto check = [&](float& v, double eps, double an, double scale, const std::string& what) {
    ++tried;
    Fd fd = finite_diff(loss, v, eps);
    if (std::fabs(fd.plus - fd.minus) > 0.02 * (std::fabs(an) + scale)) return;  // a kink
    ++checked;
    EXPECT_TRUE(fd_agrees(fd.central, an, 1e-2, scale)) << what;
  };
  for (int64_t i : pick(shape_numel(s), 8, 143))
    check(xt.data<float>()[offset_of(xt, i)], 1e-2, dx[size_t(i)], rms(dx),
          "x[" + std::to_string(i) + "]");
  for (size_t k = 0; k < ps.size(); ++k) {
    Param* p = ps[k];
    Vec g = to_vec(p->grad);
    for (double v : g) ASSERT_FALSE(std::isnan(v)) << p->name << " gradient not written";
    for (int64_t i : pick(p->value.numel(), 2, 144 + uint32_t(k)))
      check(p->value.data<float>()[i], 1e-3, g[size_t(i)], rms(g),
            p->name + "[" + std::to_string(i) + "]");
  }
  EXPECT_GE(checked, tried * 8 / 10) << "too many elements sat on a ReLU kink";
}

INSTANTIATE_TEST_SUITE_P(
    Blocks, ResidualBlockTest,
    ::testing::Values(
        BlockCase{"basic_identity", [] { return resnet20_block(0, 0); }, 2, 16, 6, 6},
        BlockCase{"basic_downsample", [] { return resnet20_block(1, 0); }, 2, 16, 7, 7},
        BlockCase{"bottleneck_downsample", [] { return bottleneck(8, 4, 2); }, 2, 8, 7, 7},
        BlockCase{"bottleneck_stride1", [] { return bottleneck(8, 4, 1); }, 2, 8, 5, 5}),
    [](const ::testing::TestParamInfo<BlockCase>& i) { return std::string(i.param.name); });

// A residual block's last BN takes the shortcut and does Add and ReLU in one backend op
// (batchnorm_add_relu_*), its first convolution adds its input gradient to the shortcut's
// (conv2d_backward_data_add), and ProfiledBackend sees every op of the block without changing
// a bit of what it computes.
TEST(ResidualBlock, TailBatchNormAddsTheShortcutInOneOpAndTheProfileCountsEveryOp) {
  auto run = [](Backend& be, std::vector<Vec>* grads) {
    std::unique_ptr<Layer> block = bottleneck(8, 4, 2);
    randomize_params(*block, 150);
    Shape s{2, 8, 7, 7};
    Tensor x = make_tensor(normals(shape_numel(s), 151), s, Layout::blocked);
    Context ctx = train_ctx(be);
    Tensor y = block->forward(x, ctx);
    Vec out = values(be, y);
    Tensor dx = block->backward(make_like(normals(y.numel(), 152), y), ctx);
    std::vector<Param*> ps;
    block->collect_params(ps);
    for (Param* p : ps) grads->push_back(to_vec(p->grad));
    grads->push_back(values(be, dx));
    return out;
  };
  auto plain = cpu_backend();
  std::vector<Vec> g0, g1;
  Vec y0 = run(*plain, &g0);
  ProfiledBackend prof(cpu_backend());
  Vec y1 = run(prof, &g1);
  prof.collect(true);
  EXPECT_EQ(y1, y0);
  EXPECT_EQ(g1, g0);
  std::map<std::string, double> calls;
  for (const auto& r : prof.by_op()) {
    calls[r.name] = r.calls_per_step;
    EXPECT_GE(r.ms_per_step, 0.0) << r.name;
  }
  EXPECT_EQ(calls["conv2d_forward"], 4);  // three on the main branch, one on the shortcut
  EXPECT_EQ(calls["conv2d_backward_weights"], 4);
  EXPECT_EQ(calls["batchnorm_add_relu_forward"], 1);
  EXPECT_EQ(calls["batchnorm_add_relu_backward"], 1);
  EXPECT_EQ(calls.count("add_forward+relu"), 0u) << "the block's Add ran on its own";
  // The input gradient, main + shortcut: the main branch's first convolution adds its own to
  // the shortcut's.
  EXPECT_EQ(calls["conv2d_backward_data_add"], 1);
  EXPECT_EQ(calls["conv2d_backward_data"], 3);  // conv2, conv3, the shortcut's
  EXPECT_EQ(calls["add_forward"], 0);
  EXPECT_FALSE(prof.report().empty());
}

// ============================================================================================
// 6. Softmax cross-entropy.
// ============================================================================================

struct XentCase {
  float smoothing, grad_scale;
};

class SoftmaxXentTest : public ::testing::TestWithParam<XentCase> {};

TEST_P(SoftmaxXentTest, LossAndGradientMatchFloat64) {
  auto be = cpu_backend();
  int N = 6, M = 10;
  Floats z = normals(int64_t(N) * M, 150, 2.f, 1.f);
  std::vector<int32_t> labels(static_cast<size_t>(N));
  Philox rng(9, 151);
  for (auto& l : labels) l = int32_t(rng.below(uint32_t(M)));
  Tensor zt = make_tensor(z, {N, M});
  Tensor dz({N, M}, DType::f32, Allocator::host());
  fill_nan(dz);
  auto [smoothing, scale] = GetParam();
  LossResult res = be->softmax_xent(zt, labels.data(), smoothing, scale, &dz);
  Vec want_dz;
  double want = xent_ref(to_vec(z), labels, N, M, smoothing, scale, want_dz);
  EXPECT_NEAR(res.loss, want, 1e-6 * std::fabs(want));
  EXPECT_TRUE(close(to_vec(dz), want_dz, 1e-5));
  // Without a gradient tensor the loss is the same.
  EXPECT_DOUBLE_EQ(be->softmax_xent(zt, labels.data(), smoothing, scale, nullptr).loss, res.loss);
  // An undefined tensor is allocated.
  Tensor fresh;
  be->softmax_xent(zt, labels.data(), smoothing, scale, &fresh);
  ASSERT_TRUE(fresh.defined());
  EXPECT_TRUE(close(to_vec(fresh), want_dz, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(SmoothingAndScale, SoftmaxXentTest,
                         ::testing::Values(XentCase{0.f, 1.f}, XentCase{0.1f, 1.f},
                                           XentCase{0.f, 128.f}, XentCase{0.1f, 128.f}));

TEST(SoftmaxXent, TopOneAndTopFiveOnConstructedLogits) {
  auto be = cpu_backend();
  int M = 10;
  const std::vector<int> rank = {0, 0, 1, 4, 5, 9, 2, 7, 3, 6};  // the label's place by logit
  int N = int(rank.size());
  Floats z(size_t(N) * M);
  std::vector<int32_t> labels(static_cast<size_t>(N));
  Philox rng(11, 160);
  for (int i = 0; i < N; ++i) {
    // Distinct random logits; the label gets the rank[i]-th largest.
    Floats v = normals(M, 161 + uint32_t(i));
    for (int j = 0; j < M; ++j) v[size_t(j)] += 0.5f * float(j);  // no ties
    std::sort(v.begin(), v.end(), std::greater<float>());
    int32_t y = int32_t(rng.below(uint32_t(M)));
    labels[size_t(i)] = y;
    std::vector<int> others;
    for (int j = 0; j < M; ++j)
      if (j != y) others.push_back(j);
    for (int j = int(others.size()) - 1; j > 0; --j)
      std::swap(others[size_t(j)], others[rng.below(uint32_t(j + 1))]);
    z[size_t(i * M + y)] = v[size_t(rank[size_t(i)])];
    for (int j = 0, k = 0; j < M; ++j) {
      if (j == rank[size_t(i)]) continue;
      z[size_t(i * M + others[size_t(k++)])] = v[size_t(j)];
    }
  }
  LossResult res = be->softmax_xent(make_tensor(z, {N, M}), labels.data(), 0.f, 1.f, nullptr);
  EXPECT_EQ(res.top1, 2);
  EXPECT_EQ(res.top5, 6);  // ranks 0, 0, 1, 4, 2, 3
}

// ============================================================================================
// 7. Gradient checkpointing: bitwise the same gradients and running statistics.
// ============================================================================================

struct StepOutcome {
  std::vector<std::string> names;
  std::vector<Floats> logits, grads, buffers;  // per step; buffers after the last step
  std::vector<double> losses;
  Floats eval_logits;
};

Floats host_floats(Backend& be, const Tensor& t) {
  Tensor h = be.to_host(t);
  return Floats(h.data<float>(), h.data<float>() + h.numel());
}

StepOutcome resnet20_steps(Backend& be, const std::string& mode) {
  ResNetOptions o;
  o.arch = "resnet20";
  o.in_channels = 1;
  o.num_classes = 10;
  o.grad_checkpoint = mode;
  Model m(build_resnet(o), be);
  m.initialize(4242);
  StepOutcome out;
  for (auto* p : m.params()) out.names.push_back(p->name);
  int N = 4;
  std::vector<int32_t> labels = {3, 7, 0, 9};
  for (int step = 0; step < 2; ++step) {
    Tensor x = make_tensor(normals(int64_t(N) * 12 * 12, 170 + uint32_t(step)), {N, 1, 12, 12},
                           Layout::nhwc);
    Tensor logits = m.forward(be.upload_images(x), true);
    Tensor dl;
    out.losses.push_back(be.softmax_xent(logits, labels.data(), 0.1f, 1.f, &dl).loss);
    out.logits.push_back(host_floats(be, logits));
    be.fill(m.flat_grads(), kNaN);  // every gradient must be overwritten
    m.backward(dl);
    out.grads.push_back(host_floats(be, m.flat_grads()));
  }
  for (auto* b : m.buffers()) {
    Floats v = host_floats(be, b->value);
    out.buffers.insert(out.buffers.end(), v);
  }
  Tensor x = make_tensor(normals(int64_t(N) * 12 * 12, 180), {N, 1, 12, 12}, Layout::nhwc);
  out.eval_logits = host_floats(be, m.forward(be.upload_images(x), false));
  return out;
}

bool bitwise_equal(const Floats& a, const Floats& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class Checkpointing : public ::testing::TestWithParam<int> {};  // compute threads

TEST_P(Checkpointing, ModesGiveBitwiseIdenticalGradientsAndStatistics) {
  auto be = cpu_backend(GetParam());
  StepOutcome ref = resnet20_steps(*be, "none");
  for (const Floats& g : ref.grads) {
    size_t nan = size_t(std::count_if(g.begin(), g.end(), [](float v) { return std::isnan(v); }));
    EXPECT_EQ(nan, 0u) << "gradient elements left unwritten";
    EXPECT_GT(rms(to_vec(g)), 0.0);
  }
  for (const char* mode : {"block", "stage", "every:2"}) {
    SCOPED_TRACE(mode);
    StepOutcome got = resnet20_steps(*be, mode);
    ASSERT_EQ(got.names, ref.names);
    for (size_t s = 0; s < ref.grads.size(); ++s) {
      EXPECT_EQ(got.losses[s], ref.losses[s]) << "step " << s;
      EXPECT_TRUE(bitwise_equal(got.logits[s], ref.logits[s])) << "logits, step " << s;
      EXPECT_TRUE(bitwise_equal(got.grads[s], ref.grads[s])) << "gradients, step " << s;
    }
    ASSERT_EQ(got.buffers.size(), ref.buffers.size());
    for (size_t b = 0; b < ref.buffers.size(); ++b)
      EXPECT_TRUE(bitwise_equal(got.buffers[b], ref.buffers[b])) << "buffer " << b;
    EXPECT_TRUE(bitwise_equal(got.eval_logits, ref.eval_logits)) << "eval logits";
  }
  if (GetParam() == 1) return;
  // Against one thread: the same numbers up to summation order.
  auto one = cpu_backend(1);
  StepOutcome single = resnet20_steps(*one, "none");
  for (size_t s = 0; s < ref.grads.size(); ++s) {
    EXPECT_TRUE(close(to_vec(ref.logits[s]), to_vec(single.logits[s]), 1e-4)) << "step " << s;
    EXPECT_TRUE(close(to_vec(ref.grads[s]), to_vec(single.grads[s]), 1e-4)) << "step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, Checkpointing, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "_threads";
                         });

}  // namespace
