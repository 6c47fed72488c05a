// The float64 reference (see reference_backend.h): data movement and the casts (rounding written
// out from the formats' definitions, not taken from core/half.h, which the backends under test
// use), the elementwise ops, pooling, Linear, the loss and the optimizer steps.
#include "kernels/reference/reference_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace spotrain {

std::unique_ptr<Backend> make_reference_backend() {
  return std::make_unique<reference::ReferenceBackend>();
}

namespace reference {

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- the storage formats ----------------------------------------------------------------------

// x rounded to the nearest number with `bits` significand bits (the leading one included) and
// exponents down to `emin` (below it, the fixed spacing of subnormals), ties to the even one;
// past `max` (the largest finite number) it overflows to inf, as IEEE 754 rounds.
double round_to(double x, int bits, int emin, double max) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  int e = 0;
  std::frexp(x, &e);  // |x| = m * 2^e with 0.5 <= m < 1: its leading bit is worth 2^(e - 1)
  const double spacing = std::ldexp(1.0, std::max(e - 1, emin) - (bits - 1));
  const double r = std::nearbyint(x / spacing) * spacing;  // the default mode: ties to even
  return std::fabs(r) > max ? std::copysign(kInf, x) : r;
}
// bf16: 8 significand bits, fp32's exponents; fp16 (IEEE binary16): 11 bits, exponents to -14.
const double kBf16Max = std::ldexp(255.0, 120);     // (2 - 2^-7) * 2^127
const double kFp16Max = 65504.0;                     // (2 - 2^-10) * 2^15
double round_bf16(double x) { return round_to(x, 8, -126, kBf16Max); }
double round_fp16(double x) { return round_to(x, 11, -14, kFp16Max); }
double round_fp32(double x) { return double(float(x)); }  // C++'s conversion rounds to nearest even

// The 16-bit words of a value already rounded to the format, and back.
uint16_t bf16_word(double r) {
  if (std::isnan(r)) return 0x7fc0;  // a quiet NaN (the top half of a NaN float may read as inf)
  const float f = float(r);          // exact: r has 8 significand bits
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t(u >> 16);
}
double bf16_value(uint16_t word) {
  const uint32_t u = uint32_t(word) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t fp16_word(double r) {
  const uint16_t sign = std::signbit(r) ? 0x8000 : 0;
  const double a = std::fabs(r);
  if (std::isnan(r)) return 0x7e00;
  if (std::isinf(a)) return uint16_t(sign | 0x7c00);
  if (a < std::ldexp(1.0, -14)) return uint16_t(sign | uint16_t(a * std::ldexp(1.0, 24)));  // k * 2^-24
  int e = 0;
  const double m = std::frexp(a, &e);  // a = (2m) * 2^(e - 1), 1 <= 2m < 2
  return uint16_t(sign | uint16_t((e - 1 + 15) << 10) | uint16_t((2 * m - 1) * 1024));
}
double fp16_value(uint16_t word) {
  const double sign = (word & 0x8000) ? -1 : 1;
  const int e = (word >> 10) & 0x1f, m = word & 0x3ff;
  if (e == 0x1f) return m ? kNaN : sign * kInf;
  if (e == 0) return sign * m * std::ldexp(1.0, -24);
  return sign * (1 + m / 1024.0) * std::ldexp(1.0, e - 15);
}

// Element i of a tensor of a float dtype, as a double; and v rounded into element i.
double load(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::f32: return t.data<float>()[i];
    case DType::bf16: return bf16_value(t.data<uint16_t>()[i]);
    case DType::f16: return fp16_value(t.data<uint16_t>()[i]);
    default: SPOTRAIN_THROW("reference: no float values in a ", dtype_name(t.dtype()), " tensor");
  }
}
void put(Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::f32: t.data<float>()[i] = float(v); return;
    case DType::bf16: t.data<uint16_t>()[i] = bf16_word(round_bf16(v)); return;
    case DType::f16: t.data<uint16_t>()[i] = fp16_word(round_fp16(v)); return;
    default: SPOTRAIN_THROW("reference: cannot store floats in a ", dtype_name(t.dtype()), " tensor");
  }
}

Tensor new_like(const Tensor& t, DType dt) { return Tensor(t.shape(), dt, Allocator::host(), t.layout()); }

void check_fp32(const Tensor& t, const char* op) {
  SPOTRAIN_CHECK(t.defined() && t.dtype() == DType::f32 && t.device() == Device::cpu &&
                     t.layout() != Layout::blocked && t.storage_elems() == t.numel(),
                 "reference ", op, ": takes fp32 tensors in NHWC or plain order, got ",
                 t.defined() ? t.describe() : std::string("none"));
}
void check_same(const Tensor& a, const Tensor& b, const char* op) {
  check_fp32(a, op);
  check_fp32(b, op);
  SPOTRAIN_CHECK(a.shape() == b.shape() && a.layout() == b.layout(), "reference ", op,
                 ": operands differ: ", a.describe(), " vs ", b.describe());
}

// f(value) of every element of a, as a new fp32 tensor of a's shape and layout.
template <class F>
Tensor map1(const Tensor& a, const char* op, F f) {
  check_fp32(a, op);
  Tensor y = new_like(a, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) y.data<float>()[i] = float(f(double(a.data<float>()[i])));
  return y;
}
template <class F>
Tensor map2(const Tensor& a, const Tensor& b, const char* op, F f) {
  check_same(a, b, op);
  Tensor y = new_like(a, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i)
    y.data<float>()[i] = float(f(double(a.data<float>()[i]), double(b.data<float>()[i])));
  return y;
}

double relu(double v) { return v > 0 ? v : 0; }

}  // namespace

// ---- the shared conversions --------------------------------------------------------------------

Act act_of(const Tensor& t, const char* op) {
  check_fp32(t, op);
  SPOTRAIN_CHECK(t.ndim() == 4 && t.layout() == Layout::nhwc, "reference ", op,
                 ": takes activations (N, C, H, W) in NHWC, got ", t.describe());
  Act a(t.dim(0), t.dim(1), t.dim(2), t.dim(3));
  const float* p = t.data<float>();
  for (int64_t n = 0; n < a.n; ++n)
    for (int64_t y = 0; y < a.h; ++y)
      for (int64_t x = 0; x < a.w; ++x)
        for (int64_t c = 0; c < a.c; ++c) a.at(n, c, y, x) = *p++;
  return a;
}

Tensor tensor_of(const Act& a) {
  Tensor t(a.shape(), DType::f32, Allocator::host(), Layout::nhwc);
  float* p = t.data<float>();
  for (int64_t n = 0; n < a.n; ++n)
    for (int64_t y = 0; y < a.h; ++y)
      for (int64_t x = 0; x < a.w; ++x)
        for (int64_t c = 0; c < a.c; ++c) *p++ = float(a.at(n, c, y, x));
  return t;
}

std::vector<double> doubles_of(const Tensor& t, const char* op) {
  check_fp32(t, op);
  SPOTRAIN_CHECK(t.layout() == Layout::plain, "reference ", op, ": takes a plain tensor here, got ",
                 t.describe());
  return std::vector<double>(t.data<float>(), t.data<float>() + t.numel());
}

Tensor plain_of(const Shape& shape, const std::vector<double>& v) {
  Tensor t(shape, DType::f32, Allocator::host());
  store(t, v);
  return t;
}

void store(Tensor& t, const std::vector<double>& v) {
  check_fp32(t, "store");
  SPOTRAIN_CHECK(size_t(t.numel()) == v.size(), "reference: ", v.size(), " values for ", t.describe());
  float* p = static_cast<float*>(t.write_raw());
  for (size_t i = 0; i < v.size(); ++i) p[i] = float(v[i]);
}

// ---- data movement -----------------------------------------------------------------------------

Tensor ReferenceBackend::to_host(const Tensor& t) {
  SPOTRAIN_CHECK(t.layout() != Layout::blocked, "reference to_host: a blocked tensor ", t.describe());
  Tensor out(t.shape(), DType::f32, Allocator::host(), Layout::plain);
  float* o = out.data<float>();
  if (t.ndim() == 4 && t.layout() == Layout::nhwc) {  // NHWC -> NCHW
    const int64_t N = t.dim(0), C = t.dim(1), H = t.dim(2), W = t.dim(3);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t y = 0; y < H; ++y)
          for (int64_t x = 0; x < W; ++x) *o++ = float(load(t, ((n * H + y) * W + x) * C + c));
  } else {
    for (int64_t i = 0; i < t.numel(); ++i) o[i] = float(load(t, i));
  }
  return out;
}

Tensor ReferenceBackend::from_host(const Tensor& t) {
  SPOTRAIN_CHECK(t.layout() != Layout::blocked, "reference from_host: a blocked tensor ", t.describe());
  Tensor out(t.shape(), t.dtype(), Allocator::host(), t.layout(), t.storage_elems());
  std::memcpy(out.raw(), t.raw(), t.nbytes());
  return out;
}

Tensor ReferenceBackend::upload_images_impl(const Tensor& h, DType compute) {
  SPOTRAIN_CHECK(h.ndim() == 4 && h.layout() == Layout::nhwc && h.dtype() == DType::f32,
                 "upload_images expects an fp32 NHWC batch, got ", h.describe());
  return cast_impl(h, compute);
}

// (pixel / 255 - mean) / std as fma(pixel, scale(c), shift(c)) in fp32, the op's definition
// (core/pixel_norm.h): pixel * scale + shift is exact in double here, so one rounding to fp32
// gives the fma's value; then the compute dtype's rounding.
Tensor ReferenceBackend::upload_pixels_impl(const Tensor& h, const PixelNorm& norm, DType compute) {
  check_pixel_batch(h, compute);
  const int64_t c = h.dim(1);
  const uint8_t* px = static_cast<const uint8_t*>(h.raw());
  Tensor out = new_like(h, compute);
  for (int64_t i = 0; i < h.numel(); ++i) {
    const int k = int(i % c);
    put(out, i, round_fp32(double(px[i]) * double(norm.scale(k)) + double(norm.shift(k))));
  }
  return out;
}

Tensor ReferenceBackend::cast_impl(const Tensor& t, DType to) {
  SPOTRAIN_CHECK(to == DType::f32 || to == DType::bf16 || to == DType::f16,
                 "cast: unsupported conversion to ", dtype_name(to));
  SPOTRAIN_CHECK(t.layout() != Layout::blocked, "reference cast: a blocked tensor ", t.describe());
  Tensor out = new_like(t, to);
  for (int64_t i = 0; i < t.numel(); ++i) put(out, i, load(t, i));
  return out;
}

Tensor ReferenceBackend::zeros_impl(const Shape& shape) {
  Tensor t(shape, DType::f32, Allocator::host());
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

void ReferenceBackend::fill_impl(Tensor& t, float value) {
  check_fp32(t, "fill");
  float* p = static_cast<float*>(t.write_raw());
  std::fill(p, p + t.numel(), value);
}

void ReferenceBackend::copy_impl(const Tensor& src, Tensor& dst) {
  SPOTRAIN_CHECK(src.nbytes() == dst.nbytes() && src.dtype() == dst.dtype(),
                 "copy: size mismatch ", src.describe(), " vs ", dst.describe());
  std::memcpy(dst.write_raw(), src.raw(), src.nbytes());
}

// ---- elementwise -------------------------------------------------------------------------------

Tensor ReferenceBackend::relu_forward_impl(const Tensor& x) { return map1(x, "relu_forward", relu); }

Tensor ReferenceBackend::relu_backward_impl(const Tensor& dy, const Tensor& y) {
  return map2(dy, y, "relu_backward", [](double g, double out) { return out > 0 ? g : 0; });
}

Tensor ReferenceBackend::add_forward_impl(const Tensor& a, const Tensor& b, bool with_relu) {
  return map2(a, b, "add_forward", [&](double u, double v) { return with_relu ? relu(u + v) : u + v; });
}

Tensor ReferenceBackend::add_backward_impl(const Tensor& dy, const Tensor& y, bool with_relu) {
  return map2(dy, y, "add_backward", [&](double g, double out) { return !with_relu || out > 0 ? g : 0; });
}

// ---- pooling -----------------------------------------------------------------------------------

// y[n,c,oy,ox] = the largest x[n, c, oy*s - pad + i, ox*s - pad + j] over the k x k window (the
// padding never taken); the workspace keeps where each maximum lay (y * W + x; the first
// position scanned on ties, a NaN where the window has one).
Tensor ReferenceBackend::maxpool_forward_impl(const Tensor& xt, const PoolParams& p, Tensor& workspace) {
  const Act x = act_of(xt, "maxpool_forward");
  Act y(x.n, x.c, (x.h + 2 * p.pad - p.k) / p.stride + 1, (x.w + 2 * p.pad - p.k) / p.stride + 1);
  workspace = Tensor(y.shape(), DType::i32, Allocator::host());
  int32_t* where = workspace.data<int32_t>();
  for (int64_t n = 0; n < y.n; ++n)
    for (int64_t c = 0; c < y.c; ++c)
      for (int64_t oy = 0; oy < y.h; ++oy)
        for (int64_t ox = 0; ox < y.w; ++ox) {
          double best = -kInf;
          int64_t at = -1;
          for (int i = 0; i < p.k; ++i)
            for (int j = 0; j < p.k; ++j) {
              const int64_t iy = oy * p.stride - p.pad + i, ix = ox * p.stride - p.pad + j;
              if (iy < 0 || iy >= x.h || ix < 0 || ix >= x.w) continue;
              const double v = x.at(n, c, iy, ix);
              if (at < 0 || v > best || (std::isnan(v) && !std::isnan(best))) {
                best = v;
                at = iy * x.w + ix;
              }
            }
          y.at(n, c, oy, ox) = best;
          *where++ = int32_t(at);
        }
  return tensor_of(y);
}

// dx[n,c,iy,ix] = the sum of dy over the windows whose maximum lay there.
Tensor ReferenceBackend::maxpool_backward_impl(const Tensor& dyt, const Tensor& xt, const Tensor& workspace,
                                               const PoolParams& p) {
  const Act dy = act_of(dyt, "maxpool_backward"), x = act_of(xt, "maxpool_backward");
  SPOTRAIN_CHECK(workspace.dtype() == DType::i32 && workspace.shape() == dy.shape(),
                 "reference maxpool_backward: the workspace is not its forward's");
  Act dx(x.n, x.c, x.h, x.w);
  const int32_t* where = workspace.data<int32_t>();
  for (int64_t n = 0; n < dy.n; ++n)
    for (int64_t c = 0; c < dy.c; ++c)
      for (int64_t o = 0; o < dy.h * dy.w; ++o, ++where)
        dx.v[size_t((n * x.c + c) * x.h * x.w + *where)] += dy.v[size_t((n * dy.c + c) * dy.h * dy.w + o)];
  return tensor_of(dx);
}

// y[n,c] = the mean of x[n,c,:,:], fp32 plain.
Tensor ReferenceBackend::global_avgpool_forward_impl(const Tensor& xt) {
  const Act x = act_of(xt, "global_avgpool_forward");
  std::vector<double> y(size_t(x.n * x.c), 0.);
  for (int64_t n = 0; n < x.n; ++n)
    for (int64_t c = 0; c < x.c; ++c) {
      double s = 0;
      for (int64_t i = 0; i < x.h; ++i)
        for (int64_t j = 0; j < x.w; ++j) s += x.at(n, c, i, j);
      y[size_t(n * x.c + c)] = s / double(x.h * x.w);
    }
  return plain_of({x.n, x.c}, y);
}

// dx[n,c,i,j] = dy[n,c] / (H * W).
Tensor ReferenceBackend::global_avgpool_backward_impl(const Tensor& dyt, const Tensor& xt) {
  const std::vector<double> dy = doubles_of(dyt, "global_avgpool_backward");
  SPOTRAIN_CHECK(xt.ndim() == 4 && int64_t(dy.size()) == xt.dim(0) * xt.dim(1),
                 "reference global_avgpool_backward: dy ", dyt.describe(), " for x ", xt.describe());
  Act dx(xt.dim(0), xt.dim(1), xt.dim(2), xt.dim(3));
  for (int64_t n = 0; n < dx.n; ++n)
    for (int64_t c = 0; c < dx.c; ++c)
      for (int64_t i = 0; i < dx.h; ++i)
        for (int64_t j = 0; j < dx.w; ++j) dx.at(n, c, i, j) = dy[size_t(n * dx.c + c)] / double(dx.h * dx.w);
  return tensor_of(dx);
}

// ---- Linear: y (N, M) = x (N, K) w^T (M, K) + b (M) --------------------------------------------

Tensor ReferenceBackend::linear_forward_impl(const Tensor& xt, const Tensor& wt, const Tensor& bt) {
  const std::vector<double> x = doubles_of(xt, "linear_forward"), w = doubles_of(wt, "linear_forward"),
                            b = doubles_of(bt, "linear_forward");
  SPOTRAIN_CHECK(xt.ndim() == 2 && wt.ndim() == 2 && xt.dim(1) == wt.dim(1) && bt.numel() == wt.dim(0),
                 "linear: input ", xt.describe(), " does not match weights ", wt.describe());
  const int64_t N = xt.dim(0), K = xt.dim(1), M = wt.dim(0);
  std::vector<double> y(size_t(N * M));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < M; ++j) {
      double s = b[size_t(j)];
      for (int64_t k = 0; k < K; ++k) s += x[size_t(i * K + k)] * w[size_t(j * K + k)];
      y[size_t(i * M + j)] = s;
    }
  return plain_of({N, M}, y);
}

// dw[j,k] = sum_i dy[i,j] x[i,k];  db[j] = sum_i dy[i,j];  dx[i,k] = sum_j dy[i,j] w[j,k].
Tensor ReferenceBackend::linear_backward_impl(const Tensor& dyt, const Tensor& xt, const Tensor& wt,
                                              Tensor& dwt, Tensor& dbt, bool need_dx) {
  const std::vector<double> dy = doubles_of(dyt, "linear_backward"), x = doubles_of(xt, "linear_backward"),
                            w = doubles_of(wt, "linear_backward");
  const int64_t N = xt.dim(0), K = xt.dim(1), M = wt.dim(0);
  std::vector<double> dw(size_t(M * K), 0.), db(size_t(M), 0.), dx(size_t(N * K), 0.);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < M; ++j) {
      const double g = dy[size_t(i * M + j)];
      db[size_t(j)] += g;
      for (int64_t k = 0; k < K; ++k) {
        dw[size_t(j * K + k)] += g * x[size_t(i * K + k)];
        dx[size_t(i * K + k)] += g * w[size_t(j * K + k)];
      }
    }
  store(dwt, dw);
  store(dbt, db);
  return need_dx ? plain_of({N, K}, dx) : Tensor();
}

// ---- the loss ----------------------------------------------------------------------------------

// Row i, with targets q (1 - smoothing + smoothing / M at the label, smoothing / M elsewhere;
// with mixed targets lam of label i's and 1 - lam of label_b's): loss_i = sum_j q_j (lse - z_j),
// lse = log sum_j exp(z_j); the gradient (softmax_j - q_j) * grad_scale / N. The label ranks
// below every logit larger than its own, every equal one of a lower index, and every NaN: top-1
// when none is above it, top-5 when fewer than five are.
LossResult ReferenceBackend::softmax_xent_impl(const Tensor& lt, const int32_t* labels, float smoothing,
                                               float grad_scale, Tensor* dlogits, const LabelMix* mix) {
  const std::vector<double> z = doubles_of(lt, "softmax_xent");
  SPOTRAIN_CHECK(lt.ndim() == 2, "softmax_xent: logits must be (N, classes), got ", lt.describe());
  const int64_t N = lt.dim(0), M = lt.dim(1);
  std::vector<double> dz(size_t(N * M));
  double total = 0;
  LossResult r;
  for (int64_t i = 0; i < N; ++i) {
    const double* row = &z[size_t(i * M)];
    std::vector<double> q(size_t(M), double(smoothing) / double(M));
    q[size_t(labels[i])] += 1 - double(smoothing);
    if (mix) {
      const double lam = mix->lam[i];
      for (double& v : q) v *= lam;
      for (int64_t j = 0; j < M; ++j) q[size_t(j)] += (1 - lam) * double(smoothing) / double(M);
      q[size_t(mix->labels_b[i])] += (1 - lam) * (1 - double(smoothing));
    }
    double mx = row[0];
    for (int64_t j = 1; j < M; ++j) mx = std::max(mx, row[j]);
    double se = 0;
    for (int64_t j = 0; j < M; ++j) se += std::exp(row[j] - mx);
    const double lse = mx + std::log(se);
    int64_t above = 0;
    const double zy = row[labels[i]];
    for (int64_t j = 0; j < M; ++j) {
      total += q[size_t(j)] * (lse - row[j]);
      dz[size_t(i * M + j)] = (std::exp(row[j] - lse) - q[size_t(j)]) * double(grad_scale) / double(N);
      const bool nan = std::isnan(row[j]) || std::isnan(zy);
      above += nan || row[j] > zy || (row[j] == zy && j < labels[i]);
    }
    r.top1 += above < 1;
    r.top5 += above < 5;
  }
  r.loss = total / double(N);
  if (dlogits) {
    if (!dlogits->defined()) *dlogits = Tensor({N, M}, DType::f32, Allocator::host());
    store(*dlogits, dz);
  }
  return r;
}

// ---- the optimizer -----------------------------------------------------------------------------

// torch.optim.SGD per element: g = grad * grad_scale + wd * p;  m = momentum * m + g;
// p -= lr * (nesterov ? g + momentum * m : m). Skipped after a queued overflow verdict.
void ReferenceBackend::sgd_step_impl(Tensor& params, const Tensor& grads, Tensor& momentum,
                                     const std::vector<SgdSegment>& segments, const SgdHyper& h) {
  if (h.skip_on_overflow && queued_overflow_) return;
  std::vector<double> p = doubles_of(params, "sgd_step"), m = doubles_of(momentum, "sgd_step");
  const std::vector<double> g = doubles_of(grads, "sgd_step");
  for (const SgdSegment& s : segments)
    for (int64_t i = s.offset; i < s.offset + s.count; ++i) {
      const size_t k = size_t(i);
      const double gi = g[k] * h.grad_scale + double(s.weight_decay) * p[k];
      m[k] = double(h.momentum) * m[k] + gi;
      p[k] -= double(h.lr) * (h.nesterov ? gi + double(h.momentum) * m[k] : m[k]);
    }
  store(params, p);
  store(momentum, m);
}

// LARS as the MLPerf reference (kernels/elementwise.h says where from), per segment: with
// g = grad * grad_scale, trust = eeta ||w|| / (||g|| + wd ||w|| + epsilon) where the segment is
// adapted and both norms are above zero, else 1; then per element
// v = momentum v + lr trust (g + wd w);  w -= nesterov ? momentum v + lr trust (g + wd w) : v.
void ReferenceBackend::lars_step_impl(Tensor& params, const Tensor& grads, Tensor& momentum,
                                      const std::vector<LarsSegment>& segments, const LarsHyper& h) {
  if (h.skip_on_overflow && queued_overflow_) return;
  std::vector<double> w = doubles_of(params, "lars_step"), v = doubles_of(momentum, "lars_step");
  const std::vector<double> grad = doubles_of(grads, "lars_step");
  for (const LarsSegment& s : segments) {
    SPOTRAIN_CHECK(s.offset >= 0 && s.count >= 0 && s.offset + s.count <= params.numel(),
                   "lars_step: segment outside the parameter buffer");
    double trust = 1;
    if (s.adapt) {
      double ww = 0, gg = 0;
      for (int64_t i = s.offset; i < s.offset + s.count; ++i) {
        ww += w[size_t(i)] * w[size_t(i)];
        gg += grad[size_t(i)] * h.grad_scale * grad[size_t(i)] * h.grad_scale;
      }
      const double wn = std::sqrt(ww), gn = std::sqrt(gg);
      if (wn > 0 && gn > 0) trust = double(h.trust) * wn / (gn + double(s.weight_decay) * wn + double(h.epsilon));
    }
    for (int64_t i = s.offset; i < s.offset + s.count; ++i) {
      const size_t k = size_t(i);
      const double step = double(h.lr) * trust * (grad[k] * h.grad_scale + double(s.weight_decay) * w[k]);
      v[k] = double(h.momentum) * v[k] + step;
      w[k] -= h.nesterov ? double(h.momentum) * v[k] + step : v[k];
    }
  }
  store(params, w);
  store(momentum, v);
}

// grads *= inv_scale (each product rounded to fp32); whether any is inf or NaN.
bool ReferenceBackend::unscale_and_check_impl(Tensor& grads, float inv_scale) {
  std::vector<double> g = doubles_of(grads, "unscale_and_check");
  bool bad = false;
  for (double& v : g) {
    v = round_fp32(v * double(inv_scale));
    bad |= !std::isfinite(v);
  }
  store(grads, g);
  return bad;
}

// dst += weight * (src - dst).
void ReferenceBackend::lerp_impl(Tensor& dst, const Tensor& src, float weight) {
  std::vector<double> d = doubles_of(dst, "lerp");
  const std::vector<double> s = doubles_of(src, "lerp");
  SPOTRAIN_CHECK(d.size() == s.size(), "lerp: fp32 tensors of one size, got ", dst.describe(), " and ",
                 src.describe());
  for (size_t i = 0; i < d.size(); ++i) d[i] += double(weight) * (s[i] - d[i]);
  store(dst, d);
}

}  // namespace reference
}  // namespace spotrain
