// The op suite's cases (health/op_cases.h), shared by tests/test_backend_ops.cpp and `spotrain
// doctor`: each op on the backend under test against the float64 reference (on the inputs
// rounded to the precision under test), compared by normalized error within the bounds of
// kernels/op_tolerances.h. tests/check_op_coverage.cmake checks that every op of kernels/ops.h
// is called here on the backend under test (`be->op(`).
#include "health/op_cases.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <utility>

#include "core/error.h"
#include "core/philox.h"
#include "engine/fast_paths.h"
#include "kernels/reference/reference_backend.h"
#include "kernels/wrong_op_backend.h"

namespace spotrain::health {

namespace {
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();
}  // namespace

// ---- targets and backends -------------------------------------------------------------------

OpPrecision OpTarget::precision() const { return op_precision(dt, tf32, std::string(device) == "cuda"); }

namespace {
// Every backend under test: the CPU blocked (the layout CPU training takes) and NHWC, and the
// CUDA backend, each at its precisions.
const OpTarget kTargets[] = {
    {"blocked_fp32", "cpu", Layout::blocked, DType::f32, false},
    {"blocked_bf16", "cpu", Layout::blocked, DType::bf16, false},
    {"blocked_fp16", "cpu", Layout::blocked, DType::f16, false},
    {"nhwc_fp32", "cpu", Layout::nhwc, DType::f32, false},
    {"nhwc_bf16", "cpu", Layout::nhwc, DType::bf16, false},
    {"nhwc_fp16", "cpu", Layout::nhwc, DType::f16, false},
    {"fp32", "cuda", Layout::nhwc, DType::f32, false},
    {"tf32", "cuda", Layout::nhwc, DType::f32, true},
    {"bf16", "cuda", Layout::nhwc, DType::bf16, false},
    {"fp16", "cuda", Layout::nhwc, DType::f16, false},
};
std::vector<OpTarget> targets_on(const std::string& device) {
  std::vector<OpTarget> v;
  for (const OpTarget& t : kTargets)
    if (device == t.device) v.push_back(t);
  return v;
}
}  // namespace

const std::vector<OpTarget>& cpu_op_targets() {
  static const std::vector<OpTarget> targets = targets_on("cpu");
  return targets;
}

const std::vector<OpTarget>& cuda_op_targets() {
  static const std::vector<OpTarget> targets = targets_on("cuda");
  return targets;
}

std::unique_ptr<Backend> make_op_backend(const OpTarget& t, int threads, bool autotune) {
  BackendOptions o;
  o.threads = threads;
  o.tf32 = t.tf32;
  o.poison = true;
  o.cpu_activations = t.layout;
  o.autotune = autotune;
  return plant_wrong_ops_if_asked(make_backend(t.device, o));
}

bool same_op_backend(const OpTarget& a, const OpTarget& b) {
  return std::string(a.device) == b.device && a.layout == b.layout && a.tf32 == b.tf32;
}

std::unique_ptr<Backend> make_op_reference() { return make_reference_backend(); }

// ---- checks ---------------------------------------------------------------------------------

std::string OpCheck::line() const {
  std::string s = passed() ? "pass  op " : "fail  op ";
  s += what + " " + target;
  if (!where.empty()) s += " " + where;
  s += ": ";
  if (exact) {
    s += passed() ? "holds" : detail.empty() ? "does not hold" : detail;
  } else {
    char b[96];
    std::snprintf(b, sizeof b, "normalized error %.1e %s %.1e", err, passed() ? "<=" : ">", limit);
    s += b;
  }
  return s;
}

OpCaseRun::OpCaseRun(Backend& be, Backend& ref, const OpTarget& t, std::string op_case)
    : be_(be), ref_(ref), t_(t), case_(std::move(op_case)) {}

Tensor OpCaseRun::act(const Tensor& h) { return be_.upload_activation(h, t_.dt); }
Tensor OpCaseRun::act_ref(const Tensor& h) {
  return ref_.cast(ref_.upload_activation(h, t_.dt), DType::f32);
}
double OpCaseRun::err(const Tensor& got, const Tensor& want) {
  return nerr(values(be_, got), values(ref_, want));
}
void OpCaseRun::poison(Tensor& t) { be_.fill(t, kNaN); }

OpCheck& OpCaseRun::add_check(const std::string& what) {
  OpCheck c;
  c.op_case = case_;
  c.target = t_.name;
  c.what = what;
  c.where = where();
  checks_.push_back(std::move(c));
  return checks_.back();
}

bool OpCaseRun::near(const std::string& what, double err, double limit) {
  OpCheck& c = add_check(what);
  c.err = err;
  c.limit = limit;
  return c.passed();
}

bool OpCaseRun::near(const std::string& what, const Tensor& got, const Tensor& want, OpKind kind) {
  return near(what, err(got, want), tol(kind));
}

bool OpCaseRun::expect(const std::string& what, bool ok, const std::string& detail) {
  OpCheck& c = add_check(what);
  c.exact = true;
  c.ok = ok;
  if (!ok) c.detail = detail;
  return ok;
}

bool OpCaseRun::same(const std::string& what, const std::vector<float>& got,
                     const std::vector<float>& want) {
  if (got.size() != want.size())
    return expect(what, false, str(got.size(), " values where the reference has ", want.size()));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i]) && bad++ == 0) first = i;
  return expect(what, bad == 0,
                bad ? str(bad, " of ", got.size(), " values differ, first at ", first, ": ",
                          got[first], " where ", want[first], " was wanted")
                    : "");
}

OpCaseRun::Scope::Scope(OpCaseRun& run, std::string where)
    : run_(run), uncaught_(std::uncaught_exceptions()) {
  run_.scopes_.push_back(std::move(where));
}
OpCaseRun::Scope::~Scope() {
  if (std::uncaught_exceptions() > uncaught_ && run_.thrown_where_.empty())
    run_.thrown_where_ = run_.where();  // the innermost scope an exception unwinds
  run_.scopes_.pop_back();
}

std::string OpCaseRun::where() const {
  std::string w;
  for (const std::string& s : scopes_)
    if (!s.empty()) w += (w.empty() ? "" : " ") + s;
  return w;
}

// ---- helpers --------------------------------------------------------------------------------

std::vector<float> normals(int64_t n, uint64_t seed, float scale, float shift) {
  Philox rng(seed, 77);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = rng.normal() * scale + shift;
  return v;
}

Tensor host_nhwc(const Shape& s, uint64_t seed, float scale) {
  Tensor t = Tensor::host(s, DType::f32, Layout::nhwc);
  auto v = normals(t.numel(), seed, scale);
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

Tensor host_plain(const Shape& s, uint64_t seed, float scale, float shift) {
  Tensor t = Tensor::host(s);
  auto v = normals(t.numel(), seed, scale, shift);
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

namespace {
// n values of random sign, each lo to hi in magnitude.
std::vector<double> signed_magnitudes(int64_t n, uint64_t seed, double lo, double hi) {
  Philox rng(seed, 79);
  std::vector<double> m(static_cast<size_t>(n));
  for (auto& v : m) {
    const double sign = rng.uniform() < 0.5f ? -1. : 1.;
    v = sign * (lo + (hi - lo) * rng.uniform());
  }
  return m;
}
}  // namespace

Tensor host_nhwc_shifted(const Shape& s, uint64_t seed, float scale) {
  Tensor t = host_nhwc(s, seed, scale);
  const int64_t C = s[1];
  const std::vector<double> m = signed_magnitudes(C, seed, 3. * scale, 5. * scale);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] += float(m[size_t(i % C)]);
  return t;
}

Tensor host_nhwc_distinct(const Shape& s, uint64_t seed) {
  Tensor t = Tensor::host(s, DType::f32, Layout::nhwc);
  Philox rng(seed, 78);
  int64_t c = s[1], hw = s[2] * s[3];
  for (int64_t n = 0; n < s[0]; ++n)
    for (int64_t ch = 0; ch < c; ++ch) {
      int64_t mult = 1 + rng.below(250), off = rng.below(251);
      for (int64_t p = 0; p < hw; ++p)
        t.data<float>()[(n * hw + p) * c + ch] = float((p * mult + off) % 251) / 16.f - 8.f;
    }
  return t;
}

std::vector<double> channel_means(const Tensor& h) {
  const int64_t C = h.shape()[1];
  std::vector<double> m(size_t(C), 0.);
  const float* p = h.data<float>();
  for (int64_t i = 0; i < h.numel(); ++i) m[size_t(i % C)] += p[i];
  for (double& v : m) v /= double(h.numel() / C);
  return m;
}

void shift_filter(Tensor& w, const std::vector<double>& in_mean, const std::vector<double>& out_mean) {
  const Shape& s = w.shape();  // (K, C, kh, kw), plain
  const int64_t K = s[0], C = s[1], taps = s[2] * s[3];
  SPOTRAIN_CHECK(int64_t(in_mean.size()) == C && int64_t(out_mean.size()) == K,
                 "shift_filter: ", in_mean.size(), " input and ", out_mean.size(),
                 " output means for a filter ", shape_str(s));
  double mm = 0;
  for (double m : in_mean) mm += m * m;
  SPOTRAIN_CHECK(mm > 0, "shift_filter: an input of mean zero everywhere");
  // Each tap (k, i, j) moved along in_mean until its response to the input means,
  // sum_c w[k, c, i, j] * in_mean[c], is out_mean[k] / taps: the other directions (what the
  // filter does to the input's deviations) stay as they were.
  float* p = w.data<float>();
  for (int64_t k = 0; k < K; ++k)
    for (int64_t i = 0; i < taps; ++i) {
      double now = 0;
      for (int64_t c = 0; c < C; ++c) now += double(p[(k * C + c) * taps + i]) * in_mean[size_t(c)];
      const double a = (out_mean[size_t(k)] / double(taps) - now) / mm;
      for (int64_t c = 0; c < C; ++c) p[(k * C + c) * taps + i] += float(a * in_mean[size_t(c)]);
    }
}

std::vector<float> values(Backend& be, const Tensor& t) {
  Tensor h = be.to_host(t);
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

double nerr(const std::vector<float>& got, const std::vector<float>& want) {
  return normalized_difference(got, want);  // the measure the fast paths' checks use too
}

double rel_err(double got, double want) {
  if (std::isfinite(want) && !std::isfinite(got)) return kInf;
  return std::fabs(got - want) / std::max(std::fabs(want), 1e-300);
}

std::string dims(const Shape& s) {
  std::string d = "[";
  for (size_t i = 0; i < s.size(); ++i) d += (i ? "," : "") + std::to_string(s[i]);
  return d + "]";
}

BnParams bn_params(Backend& be, const Tensor& hg, const Tensor& hb) {
  const int64_t C = hg.numel();
  BnParams p;
  p.flat = be.zeros({4 * C + 1});
  p.gamma = Tensor::view(p.flat, 1, {C});
  p.beta = Tensor::view(p.flat, 1 + C, {C});
  p.dgamma = Tensor::view(p.flat, 1 + 2 * C, {C});
  p.dbeta = Tensor::view(p.flat, 1 + 3 * C, {C});
  be.copy(be.from_host(hg), p.gamma);
  be.copy(be.from_host(hb), p.beta);
  return p;
}

// ---- the cases ------------------------------------------------------------------------------

namespace {

const char* const kShifted = "shifted-mean";  // the variant of host_nhwc_shifted inputs

// ---- convolution

struct ConvCase {
  Shape x;  // (N, C, H, W)
  int out, k, stride, pad;
};
std::string conv_str(const Shape& x, int k, int stride, int pad) {
  return dims(x) + " k" + std::to_string(k) + " s" + std::to_string(stride) + " p" + std::to_string(pad);
}

// A case's convolution: its parameters, its filter's shape, and host input and filter (scaled
// to keep outputs of unit size) from the next two seeds.
struct ConvSetup {
  ConvParams p;
  Shape ws;  // (K, C, k, k)
  Tensor hx, hw;
};
ConvSetup conv_setup(const ConvCase& cc, uint64_t& seed) {
  ConvSetup c{ConvParams{cc.k, cc.k, cc.stride, cc.pad}, Shape{cc.out, cc.x[1], cc.k, cc.k}, {}, {}};
  c.hx = host_nhwc(cc.x, ++seed);
  c.hw = host_plain(c.ws, ++seed, 1.f / std::sqrt(float(cc.x[1] * cc.k * cc.k)));
  return c;
}

// Forward, backward-data and backward-weights, then the forward again with the weights'
// cached compute copy, and after a copy into the weights (which must refresh that copy).
void convolution_forward_backward_data_and_weights(OpCaseRun& r) {
  Backend* be = r.be();
  Backend* ref = r.ref();
  const DType dt = r.dt();
  const ConvCase cases[] = {
      {{1, 3, 7, 5}, 5, 3, 1, 1},    // batch 1, odd sizes
      {{2, 16, 9, 9}, 8, 3, 2, 1},   // strided, padded
      {{3, 8, 6, 6}, 16, 1, 1, 0},   // 1x1
      {{2, 3, 17, 17}, 8, 7, 2, 3},  // stem-like
      {{1, 5, 4, 3}, 7, 1, 2, 0},    // 1x1 strided, odd channels
  };
  uint64_t seed = 100;
  for (const auto& cc : cases) {
    auto at = r.scope(conv_str(cc.x, cc.k, cc.stride, cc.pad));
    const ConvSetup c = conv_setup(cc, seed);
    const ConvParams& p = c.p;
    // The first layer's input (upload_images) and a later layer's (upload_activation).
    for (bool first : {true, false}) {
      auto as = r.scope(first ? "first-layer" : "later-layer");
      Tensor x = first ? be->upload_images(c.hx, dt) : r.act(c.hx), xr = r.act_ref(c.hx);
      Tensor w = be->from_host(c.hw), wr = ref->from_host(c.hw);
      Tensor y = be->conv2d_forward(x, w, p), yr = ref->conv2d_forward(xr, wr, p);
      if (!r.expect("conv2d_forward output shape", y.shape() == yr.shape(),
                    dims(y.shape()) + " where the reference made " + dims(yr.shape())))
        continue;
      r.expect("conv2d_forward output dtype", y.dtype() == dt,
               str(dtype_name(y.dtype()), " where ", dtype_name(dt), " was wanted"));
      r.near("conv2d_forward", y, yr, OpKind::conv);
      Tensor hdy = host_nhwc(yr.shape(), ++seed);
      Tensor dy = r.act(hdy), dyr = r.act_ref(hdy);
      Tensor dx = be->conv2d_backward_data(dy, w, x, p), dxr = ref->conv2d_backward_data(dyr, wr, xr, p);
      r.expect("conv2d_backward_data output shape", dx.shape() == x.shape(),
               dims(dx.shape()) + " for an input " + dims(x.shape()));
      r.near("conv2d_backward_data", dx, dxr, OpKind::conv);
      Tensor dw = be->zeros(c.ws), dwr = ref->zeros(c.ws);
      r.poison(dw);
      be->conv2d_backward_weights(x, dy, p, dw);
      ref->conv2d_backward_weights(xr, dyr, p, dwr);
      r.near("conv2d_backward_weights", dw, dwr, OpKind::conv);
      r.near("conv2d_forward with the cached weights", be->conv2d_forward(x, w, p), yr, OpKind::conv);
      Tensor hw2 = host_plain(c.ws, ++seed);
      be->copy(be->from_host(hw2), w);
      ref->copy(ref->from_host(hw2), wr);
      r.near("conv2d_forward after the weights changed", be->conv2d_forward(x, w, p),
             ref->conv2d_forward(xr, wr, p), OpKind::conv);
    }
  }
}

// acc += backward-data (cuDNN's beta = 1), first at a shape's first use (the algorithm search
// must not overwrite acc), then again with the algorithm chosen.
void convolution_backward_data_adds_into_the_given_gradient(OpCaseRun& r) {
  Backend* be = r.be();
  Backend* ref = r.ref();
  const ConvCase cases[] = {{{4, 32, 14, 14}, 64, 1, 1, 0}, {{2, 16, 9, 9}, 8, 3, 2, 1}};
  uint64_t seed = 700;
  for (const auto& cc : cases) {
    auto at = r.scope(conv_str(cc.x, cc.k, cc.stride, cc.pad));
    const ConvSetup c = conv_setup(cc, seed);
    Tensor x = r.act(c.hx), xr = r.act_ref(c.hx);
    Tensor w = be->from_host(c.hw), wr = ref->from_host(c.hw);
    Tensor yr = ref->conv2d_forward(xr, wr, c.p);
    Tensor hdy = host_nhwc(yr.shape(), ++seed);
    Tensor dy = r.act(hdy), dyr = r.act_ref(hdy);
    for (int round = 0; round < 2; ++round) {
      auto as = r.scope(round == 0 ? "first-use" : "algorithm-chosen");
      Tensor hacc = host_nhwc(cc.x, ++seed);
      Tensor acc = r.act(hacc), accr = r.act_ref(hacc);
      be->conv2d_backward_data_add(dy, w, x, c.p, acc);
      ref->conv2d_backward_data_add(dyr, wr, xr, c.p, accr);
      r.expect("conv2d_backward_data_add output shape", acc.shape() == x.shape(),
               dims(acc.shape()) + " for an input " + dims(x.shape()));
      r.near("conv2d_backward_data_add", acc, accr, OpKind::conv_add);
    }
  }
}

// ---- batch norm

// An op's output y and the batch statistics s it made against the reference's (yr, sr).
void output_and_statistics(OpCaseRun& r, const std::string& op, const Tensor& y, const BnSaved& s,
                           const Tensor& yr, const BnSaved& sr, OpKind kind) {
  r.near(op, y, yr, kind);
  r.near(op + " mean", s.mean, sr.mean, kind);
  r.near(op + " var", s.var, sr.var, kind);
}

// Training forward, backward, the running statistics and inference with them; centred inputs
// and inputs whose channel means lie 3 to 5 standard deviations off zero.
void batch_norm_train_backward_running_and_inference(OpCaseRun& r) {
  Backend* be = r.be();
  Backend* ref = r.ref();
  const Shape shapes[] = {{1, 3, 5, 7}, {4, 16, 6, 6}, {2, 64, 3, 3}, {8, 5, 1, 1}};
  for (bool shifted : {false, true}) {
    uint64_t seed = shifted ? 1200 : 200;
    for (const Shape& s : shapes) {
      for (bool relu : {false, true}) {
        auto at = r.scope(dims(s) + (shifted ? std::string(" ") + kShifted : "") + (relu ? " relu" : ""));
        int64_t C = s[1];
        Tensor hx = shifted ? host_nhwc_shifted(s, ++seed, 2.f) : host_nhwc(s, ++seed, 2.f);
        Tensor hg = host_plain({C}, ++seed, 0.2f, 1.f), hb = host_plain({C}, ++seed, 0.5f);
        Tensor x = r.act(hx), xr = r.act_ref(hx);
        BnParams pb = bn_params(*be, hg, hb), pr = bn_params(*ref, hg, hb);
        BnSaved sb, sr;
        Tensor y = be->batchnorm_forward_train(x, pb.gamma, pb.beta, 1e-5f, relu, sb);
        Tensor yr = ref->batchnorm_forward_train(xr, pr.gamma, pr.beta, 1e-5f, relu, sr);
        output_and_statistics(r, "batchnorm_forward_train", y, sb, yr, sr, OpKind::batch_norm);
        Tensor hdy = host_nhwc(s, ++seed);
        Tensor dy = r.act(hdy), dyr = r.act_ref(hdy);
        r.poison(pb.dgamma);
        r.poison(pb.dbeta);
        Tensor dx = be->batchnorm_backward(dy, x, pb.gamma, pb.beta, sb, 1e-5f, relu, pb.dgamma, pb.dbeta);
        Tensor dxr = ref->batchnorm_backward(dyr, xr, pr.gamma, pr.beta, sr, 1e-5f, relu, pr.dgamma, pr.dbeta);
        r.near("batchnorm_backward dx", dx, dxr, OpKind::batch_norm_backward);
        r.near("batchnorm_backward dgamma", pb.dgamma, pr.dgamma, OpKind::batch_norm_backward);
        r.near("batchnorm_backward dbeta", pb.dbeta, pr.dbeta, OpKind::batch_norm_backward);
        // Running statistics, then inference with them.
        Tensor hrm = host_plain({C}, ++seed, 0.1f), hrv = host_plain({C}, ++seed, 0.1f, 1.f);
        Tensor rm = be->from_host(hrm), rv = be->from_host(hrv);
        Tensor rmr = ref->from_host(hrm), rvr = ref->from_host(hrv);
        int64_t n = s[0] * s[2] * s[3];
        be->batchnorm_update_running(rm, rv, sb, 0.1f, n);
        ref->batchnorm_update_running(rmr, rvr, sr, 0.1f, n);
        r.near("batchnorm_update_running mean", rm, rmr, OpKind::batch_norm);
        r.near("batchnorm_update_running var", rv, rvr, OpKind::batch_norm);
        Tensor i = be->batchnorm_forward_infer(x, pb.gamma, pb.beta, rm, rv, 1e-5f, relu);
        Tensor ir = ref->batchnorm_forward_infer(xr, pr.gamma, pr.beta, rmr, rvr, 1e-5f, relu);
        r.near("batchnorm_forward_infer", i, ir, OpKind::batch_norm);
      }
    }
  }
}

// One backend's arguments of conv2d_backward_bn_relu: the convolution's filter, its input x
// (the batch norm's input), the batch norm it applies with its statistics, and its parameters
// (whose dgamma and dbeta take the gradients).
struct FusedBackwardArgs {
  const Tensor &w, &x;
  const BnApply& pro;
  const BnSaved& saved;
  BnParams& bn;
};

// conv2d_forward_bn_stats with a prologue: its output y and statistics s against the
// reference's (yr, sr), and `plain`, the same op made without the statistics.
void fused_forward_checks(OpCaseRun& r, const Tensor& y, const BnSaved& s, const Tensor& yr,
                          const BnSaved& sr, const Tensor& plain) {
  output_and_statistics(r, "conv2d_forward_bn_stats", y, s, yr, sr, OpKind::fused_forward);
  r.near("conv2d_forward_bn_stats without statistics", plain, yr, OpKind::fused_forward);
}

// conv2d_backward_bn_relu on both backends from the output gradient `hdy`, the outputs under
// test poisoned first: x's gradient, dw, dgamma and dbeta against the reference's.
void fused_backward_checks(OpCaseRun& r, const FusedBackwardArgs& a, const FusedBackwardArgs& ar,
                           const Tensor& hdy, const ConvParams& p) {
  Backend* be = r.be();
  Backend* ref = r.ref();
  Tensor dy = be->upload_activation(hdy, a.x.dtype());
  Tensor dyr = ref->cast(ref->upload_activation(hdy, a.x.dtype()), DType::f32);
  Tensor dw = be->zeros(a.w.shape()), dwr = ref->zeros(ar.w.shape());
  r.poison(dw);
  r.poison(a.bn.dgamma);
  r.poison(a.bn.dbeta);
  Tensor dx = be->conv2d_backward_bn_relu(dy, a.w, a.x, p, a.pro, a.saved, dw, a.bn.dgamma, a.bn.dbeta);
  Tensor dxr = ref->conv2d_backward_bn_relu(dyr, ar.w, ar.x, p, ar.pro, ar.saved, dwr, ar.bn.dgamma,
                                            ar.bn.dbeta);
  r.near("conv2d_backward_bn_relu dx", dx, dxr, OpKind::fused_backward);
  r.near("conv2d_backward_bn_relu dw", dw, dwr, OpKind::fused_weights);
  r.near("conv2d_backward_bn_relu dgamma", a.bn.dgamma, ar.bn.dgamma, OpKind::fused_backward);
  r.near("conv2d_backward_bn_relu dbeta", a.bn.dbeta, ar.bn.dbeta, OpKind::fused_backward);
}

// Conv + batch-norm fusion (--fusion bn): the convolution with the statistics of its output,
// without and then with the previous batch norm and ReLU applied as it reads, and the backward
// through both at once; the batch-norm backward and the running statistics run from those
// statistics. At 16 bits a GPU runs cuDNN's graph where it takes the shape, else the
// composition; the CPU composes. The shifted variant moves every channel mean of both
// convolutions' outputs about 3 to 5 standard deviations off zero (conv1's input and filters,
// bn1's beta and conv2's filters chosen so), where statistics summed in one pass lose digits.
void convolution_with_batch_norm_statistics_and_prologue(OpCaseRun& r) {
  Backend* be = r.be();
  Backend* ref = r.ref();
  const Shape xs{4, 32, 10, 10};
  const int64_t K = 64;
  const float eps = 1e-5f;
  const ConvParams p3{3, 3, 1, 1}, p1{1, 1, 1, 0};
  for (bool shifted : {false, true}) {
    const uint64_t seed = shifted ? 350 : 340;
    const std::string variant = shifted ? std::string(" ") + kShifted : "";
    const std::string at1 = conv_str(xs, 3, 1, 1) + variant;
    const std::string at2 = conv_str({xs[0], K, xs[2], xs[3]}, 1, 1, 0) + " bn-relu-prologue" + variant;
    Tensor hx = shifted ? host_nhwc_shifted(xs, seed) : host_nhwc(xs, seed);
    Tensor hw1 = host_plain({K, xs[1], 3, 3}, seed + 1, 1.f / std::sqrt(float(xs[1] * 9)));
    Tensor hw2 = host_plain({K, K, 1, 1}, seed + 2, 1.f / std::sqrt(float(K)));
    Tensor hg = host_plain({K}, seed + 3, 0.2f, 1.f);
    Tensor hb = host_plain({K}, seed + 4, 0.5f, shifted ? 4.f : 0.f);
    // conv1's outputs at 5 to 8 inside (less at the padded border: 3.2 to 4.3 standard
    // deviations over a channel)
    if (shifted) shift_filter(hw1, channel_means(hx), signed_magnitudes(K, seed + 7, 5., 8.));
    Tensor x = r.act(hx), xr = r.act_ref(hx);
    Tensor w1 = be->from_host(hw1), w1r = ref->from_host(hw1);
    // conv1 with bn1's statistics
    BnSaved s1, s1r;
    Tensor y1 = be->conv2d_forward_bn_stats(x, w1, p3, nullptr, eps, &s1);
    Tensor y1r = ref->conv2d_forward_bn_stats(xr, w1r, p3, nullptr, eps, &s1r);
    {
      auto at = r.scope(at1);
      // a convolution's output and the statistics of it, as exact as the convolution
      output_and_statistics(r, "conv2d_forward_bn_stats", y1, s1, y1r, s1r, OpKind::conv);
    }
    // conv2 applying bn1 and its ReLU as it reads y1 (each backend its own y1 and statistics),
    // with the statistics of its own output
    BnParams pb = bn_params(*be, hg, hb), pr = bn_params(*ref, hg, hb);
    BnApply ab{pb.gamma, pb.beta, s1.mean, s1.var, eps}, ar{pr.gamma, pr.beta, s1r.mean, s1r.var, eps};
    if (shifted) {
      // conv2's input, relu(bn1(y1)), has bn1's beta (~4) as its channel means (the ReLU
      // rarely cuts); its deviations share y1's border pattern, so the spread of conv2's
      // outputs is measured first (on the reference, the filter answering the means with 0),
      // then their means set 3 to 5 of it off zero.
      const std::vector<double> beta(hb.data<float>(), hb.data<float>() + K);
      shift_filter(hw2, beta, std::vector<double>(size_t(K), 0.));
      BnSaved probe;
      ref->conv2d_forward_bn_stats(y1r, ref->from_host(hw2), p1, &ar, eps, &probe);
      const std::vector<float> var = values(*ref, probe.var);
      std::vector<double> target = signed_magnitudes(K, seed + 8, 3., 5.);
      for (int64_t k = 0; k < K; ++k) target[size_t(k)] *= std::sqrt(double(var[size_t(k)]));
      shift_filter(hw2, beta, target);
    }
    Tensor w2 = be->from_host(hw2), w2r = ref->from_host(hw2);
    BnSaved s2, s2r;
    Tensor y2 = be->conv2d_forward_bn_stats(y1, w2, p1, &ab, eps, &s2);
    Tensor y2r = ref->conv2d_forward_bn_stats(y1r, w2r, p1, &ar, eps, &s2r);
    {
      auto at = r.scope(at2);
      fused_forward_checks(r, y2, s2, y2r, s2r, be->conv2d_forward_bn_stats(y1, w2, p1, &ab, eps, nullptr));
      // Backward through conv2 and bn1 + ReLU at once, from the statistics conv1 made
      BnParams qb = bn_params(*be, hg, hb), qr = bn_params(*ref, hg, hb);
      fused_backward_checks(r, {w2, y1, ab, s1, qb}, {w2r, y1r, ar, s1r, qr},
                            host_nhwc(y2r.shape(), seed + 6), p1);
    }
    // bn1's backward from the statistics conv1 made, and its running statistics
    auto at = r.scope(dims(y1r.shape()) + " after conv2d_forward_bn_stats" + variant);
    Tensor hdy = host_nhwc(y1r.shape(), seed + 5);
    Tensor dy = r.act(hdy), dyr = r.act_ref(hdy);
    r.poison(pb.dgamma);
    r.poison(pb.dbeta);
    Tensor dx = be->batchnorm_backward(dy, y1, pb.gamma, pb.beta, s1, eps, false, pb.dgamma, pb.dbeta);
    Tensor dxr = ref->batchnorm_backward(dyr, y1r, pr.gamma, pr.beta, s1r, eps, false, pr.dgamma, pr.dbeta);
    r.near("batchnorm_backward dx", dx, dxr, OpKind::batch_norm_backward);
    r.near("batchnorm_backward dgamma", pb.dgamma, pr.dgamma, OpKind::batch_norm_backward);
    r.near("batchnorm_backward dbeta", pb.dbeta, pr.dbeta, OpKind::batch_norm_backward);
    Tensor rm = be->zeros({K}), rv = be->zeros({K}), rmr = ref->zeros({K}), rvr = ref->zeros({K});
    be->batchnorm_update_running(rm, rv, s1, 0.1f, xs[0] * xs[2] * xs[3]);
    ref->batchnorm_update_running(rmr, rvr, s1r, 0.1f, xs[0] * xs[2] * xs[3]);
    r.near("batchnorm_update_running mean", rm, rmr, OpKind::batch_norm);
    r.near("batchnorm_update_running var", rv, rvr, OpKind::batch_norm);
  }
}

// The prologue where padding and stride matter (a block's 3x3 convolution, stride 1 and 2):
// the padded border must read zeros, not relu(bias), in the forward, the weight gradient and
// the data gradient; a batch-norm shift well above zero, so relu(bias) at the border shows.
void fused_prologue_holds_at_padded_and_strided_convolutions(OpCaseRun& r) {
  Backend* be = r.be();
  Backend* ref = r.ref();
  const Shape xs{4, 32, 9, 9};
  const float eps = 1e-5f;
  uint64_t seed = 900;
  for (int stride : {1, 2}) {
    auto at = r.scope(conv_str(xs, 3, stride, 1) + " bn-relu-prologue");
    const ConvParams p{3, 3, stride, 1};
    const int64_t C = xs[1], K = 48;
    // x plays the batch norm's input, its batch statistics made by each backend's own
    // batch-norm forward
    Tensor hx = host_nhwc(xs, ++seed);
    Tensor x = r.act(hx), xr = r.act_ref(hx);
    Tensor hgamma = host_plain({C}, ++seed, 0.2f, 1.f), hbeta = host_plain({C}, ++seed, 0.3f, 0.8f);
    BnParams pb = bn_params(*be, hgamma, hbeta), pr = bn_params(*ref, hgamma, hbeta);
    BnSaved sb, sr;
    be->batchnorm_forward_train(x, pb.gamma, pb.beta, eps, false, sb);
    ref->batchnorm_forward_train(xr, pr.gamma, pr.beta, eps, false, sr);
    BnApply ab{pb.gamma, pb.beta, sb.mean, sb.var, eps}, ar{pr.gamma, pr.beta, sr.mean, sr.var, eps};
    Tensor hw = host_plain({K, C, 3, 3}, ++seed, 1.f / std::sqrt(float(C * 9)));
    Tensor w = be->from_host(hw), wr = ref->from_host(hw);
    BnSaved s2, s2r;
    Tensor y = be->conv2d_forward_bn_stats(x, w, p, &ab, eps, &s2);
    Tensor yr = ref->conv2d_forward_bn_stats(xr, wr, p, &ar, eps, &s2r);
    fused_forward_checks(r, y, s2, yr, s2r, be->conv2d_forward_bn_stats(x, w, p, &ab, eps, nullptr));
    fused_backward_checks(r, {w, x, ab, sb, pb}, {wr, xr, ar, sr, pr}, host_nhwc(yr.shape(), ++seed), p);
  }
}

// relu(bn(x) + z), a residual block's tail (cuDNN's fused BN_ADD_ACTIVATION, or the
// composition where a backend has none or cuDNN refuses a shape), on centred and shifted x.
// z is chosen so that no bn(x) + z lies within 0.05 of zero: a composition at 16 bits rounds
// bn(x) before the add, and outputs that close to zero could change sign, with them the ReLU
// mask and the gradient.
void batch_norm_add_relu_matches_the_composition(OpCaseRun& r) {
  Backend* be = r.be();
  Backend* ref = r.ref();
  const Shape shapes[] = {{8, 64, 14, 14}, {4, 256, 7, 7}, {2, 6, 3, 3}};
  for (bool shifted : {false, true}) {
    uint64_t seed = shifted ? 1900 : 900;
    for (const Shape& s : shapes) {
      auto at = r.scope(dims(s) + (shifted ? std::string(" ") + kShifted : ""));
      int64_t C = s[1];
      Tensor hx = shifted ? host_nhwc_shifted(s, ++seed, 2.f) : host_nhwc(s, ++seed, 2.f);
      Tensor hz = host_nhwc(s, ++seed);
      Tensor hg = host_plain({C}, ++seed, 0.2f, 1.f), hb = host_plain({C}, ++seed, 0.5f);
      Tensor x = r.act(hx), xr = r.act_ref(hx);
      BnParams pb = bn_params(*be, hg, hb), pr = bn_params(*ref, hg, hb);
      {  // bn(x) from the reference's statistics, then z moved away from -bn(x)
        BnSaved probe;
        Tensor bnx = ref->to_host(ref->batchnorm_forward_train(xr, pr.gamma, pr.beta, 1e-5f, false, probe));
        const int64_t hw = s[2] * s[3];
        for (int64_t n = 0; n < s[0]; ++n)
          for (int64_t c = 0; c < C; ++c)
            for (int64_t i = 0; i < hw; ++i) {
              float& z = hz.data<float>()[(n * hw + i) * C + c];
              const float sum = bnx.data<float>()[(n * C + c) * hw + i] + z;
              if (std::fabs(sum) < 0.05f) z += sum < 0 ? -0.1f : 0.1f;
            }
      }
      Tensor z = r.act(hz), zr = r.act_ref(hz);
      BnSaved sb, sr;
      Tensor y = be->batchnorm_add_relu_forward_train(x, z, pb.gamma, pb.beta, 1e-5f, sb);
      Tensor yr = ref->batchnorm_add_relu_forward_train(xr, zr, pr.gamma, pr.beta, 1e-5f, sr);
      output_and_statistics(r, "batchnorm_add_relu_forward_train", y, sb, yr, sr, OpKind::batch_norm);
      Tensor hdy = host_nhwc(s, ++seed);
      Tensor dy = r.act(hdy), dyr = r.act_ref(hdy);
      r.poison(pb.dgamma);
      r.poison(pb.dbeta);
      Tensor dz, dzr;
      Tensor dx = be->batchnorm_add_relu_backward(dy, x, pb.gamma, pb.beta, sb, 1e-5f, pb.dgamma, pb.dbeta, dz);
      Tensor dxr = ref->batchnorm_add_relu_backward(dyr, xr, pr.gamma, pr.beta, sr, 1e-5f, pr.dgamma,
                                                    pr.dbeta, dzr);
      r.near("batchnorm_add_relu_backward dz", dz, dzr, OpKind::rounding);
      r.near("batchnorm_add_relu_backward dx", dx, dxr, OpKind::batch_norm_backward);
      r.near("batchnorm_add_relu_backward dgamma", pb.dgamma, pr.dgamma, OpKind::batch_norm_backward);
      r.near("batchnorm_add_relu_backward dbeta", pb.dbeta, pr.dbeta, OpKind::batch_norm_backward);
    }
  }
}

// ---- pooling

void max_pool_and_global_average_pool(OpCaseRun& r) {
  Backend* be = r.be();
  Backend* ref = r.ref();
  const DType dt = r.dt();
  const Shape shapes[] = {{1, 3, 6, 5}, {2, 8, 9, 9}, {3, 16, 4, 4}, {2, 64, 17, 16}};
  uint64_t seed = 300;
  for (const Shape& s : shapes) {
    auto at = r.scope(dims(s) + " k3 s2 p1");
    PoolParams p{3, 2, 1};
    Tensor hx = host_nhwc_distinct(s, ++seed);
    Tensor x = r.act(hx), xr = r.act_ref(hx);
    Tensor ws, wsr;
    Tensor y = be->maxpool_forward(x, p, ws), yr = ref->maxpool_forward(xr, p, wsr);
    if (!r.expect("maxpool_forward output shape", y.shape() == yr.shape(),
                  dims(y.shape()) + " where the reference made " + dims(yr.shape())))
      continue;
    r.near("maxpool_forward", y, yr, OpKind::exact);
    Tensor hdy = host_nhwc(yr.shape(), ++seed);
    Tensor dy = r.act(hdy), dyr = r.act_ref(hdy);
    r.near("maxpool_backward", be->maxpool_backward(dy, x, ws, p), ref->maxpool_backward(dyr, xr, wsr, p),
           OpKind::rounding);
    Tensor g = be->global_avgpool_forward(x), gr = ref->global_avgpool_forward(xr);
    r.expect("global_avgpool_forward output dtype", g.dtype() == DType::f32,
             str(dtype_name(g.dtype()), " where fp32 was wanted"));
    r.near("global_avgpool_forward", g, gr, OpKind::fp32_reduction);
    Tensor hd = host_plain({s[0], s[1]}, ++seed);
    Tensor gb = be->global_avgpool_backward(be->from_host(hd), x);
    Tensor gbr = ref->global_avgpool_backward(ref->from_host(hd), xr);
    r.expect("global_avgpool_backward output dtype", gb.dtype() == dt,
             str(dtype_name(gb.dtype()), " where ", dtype_name(dt), " was wanted"));
    r.near("global_avgpool_backward", gb, gbr, OpKind::rounding);
  }
}

// Ties, as after a ReLU (a window of zeros): each window's gradient goes to exactly one of
// its inputs, so the gradient is conserved: sum(dx) == sum(dy).
void max_pool_routes_each_windows_gradient_once_on_ties(OpCaseRun& r) {
  Backend* be = r.be();
  for (const Shape& s : {Shape{2, 16, 9, 9}, Shape{1, 3, 8, 7}}) {
    auto at = r.scope(dims(s) + " k3 s2 p1 all-zero");
    PoolParams p{3, 2, 1};
    Tensor hx = Tensor::host(s, DType::f32, Layout::nhwc);
    std::memset(hx.raw(), 0, hx.nbytes());
    Tensor ws;
    Tensor x = r.act(hx);
    Tensor y = be->maxpool_forward(x, p, ws);
    Tensor hdy = Tensor::host(y.shape(), DType::f32, Layout::nhwc);
    for (int64_t i = 0; i < hdy.numel(); ++i) hdy.data<float>()[i] = float(1 + i % 7);  // exact
    Tensor dx = be->maxpool_backward(r.act(hdy), x, ws, p);
    double sdx = 0, sdy = 0;
    for (float v : values(*be, dx)) sdx += v;
    for (int64_t i = 0; i < hdy.numel(); ++i) sdy += hdy.data<float>()[i];
    r.expect("maxpool_backward gives each window's gradient once", sdx == sdy,
             str("sum(dx) ", sdx, " where sum(dy) is ", sdy));
  }
}

// ---- elementwise

// ReLU is exact in any dtype (ReLU of the rounded values is representable); Add rounds once.
void relu_add_and_their_backward(OpCaseRun& r) {
  Backend* be = r.be();
  Backend* ref = r.ref();
  for (const Shape& s : {Shape{1, 3, 5, 7}, Shape{4, 33, 7, 3}}) {
    auto at = r.scope(dims(s));
    Tensor ha = host_nhwc(s, 401), hb = host_nhwc(s, 402), hd = host_nhwc(s, 403);
    Tensor a = r.act(ha), ar = r.act_ref(ha), b = r.act(hb), br = r.act_ref(hb), d = r.act(hd),
           dr = r.act_ref(hd);
    Tensor y = be->relu_forward(a), yr = ref->relu_forward(ar);
    r.near("relu_forward", y, yr, OpKind::exact);
    r.near("relu_backward", be->relu_backward(d, y), ref->relu_backward(dr, yr), OpKind::exact);
    for (bool relu : {false, true}) {
      auto as = r.scope(relu ? "relu" : "");
      Tensor s2 = be->add_forward(a, b, relu), s2r = ref->add_forward(ar, br, relu);
      r.near("add_forward", s2, s2r, OpKind::rounding);
      // The mask of y as written (rounded to dt by the backend, to fp32 by the reference: the
      // same sign); the gradient itself passes dy unchanged.
      r.near("add_backward", be->add_backward(d, s2, relu), ref->add_backward(dr, s2r, relu), OpKind::rounding);
    }
  }
}

// Casts round to nearest even, overflow fp16 to inf and keep NaN, exactly as the reference.
void cast_round_trips_bitwise_like_the_reference(OpCaseRun& r) {
  Backend* be = r.be();
  Backend* ref = r.ref();
  std::vector<float> v = normals(4099, 501, 1e4f);  // overflows fp16 at the tails
  v[7] = kNaN;
  v[8] = kInf;
  v[9] = 1e-7f;  // fp16 subnormal
  Tensor h = Tensor::host({int64_t(v.size())});
  std::memcpy(h.raw(), v.data(), v.size() * 4);
  auto at = r.scope(dims(h.shape()) + " scale 1e4 with nan inf subnormal");
  for (DType to : {DType::bf16, DType::f16}) {
    auto got = values(*be, be->cast(be->cast(be->from_host(h), to), DType::f32));
    auto want = values(*ref, ref->cast(ref->cast(ref->from_host(h), to), DType::f32));
    const std::string what = str("cast fp32 to ", dtype_name(to), " and back, bitwise");
    if (!r.expect(what, got.size() == want.size(), str(got.size(), " values where ", want.size(), " were wanted")))
      continue;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const bool ok = std::isnan(want[i]) ? std::isnan(got[i]) : std::memcmp(&want[i], &got[i], 4) == 0;
      if (!ok && bad++ == 0) first = i;
    }
    r.expect(what, bad == 0,
             bad ? str(bad, " of ", want.size(), " differ, first at ", first, ": ", got[first], " where ",
                       want[first], " was wanted")
                 : "");
  }
}

// ---- fp32 ops: Linear, loss, optimizer, overflow check

void linear_forward_and_backward(OpCaseRun& r) {
  Backend* be = r.be();
  Backend* ref = r.ref();
  struct Case {
    int64_t n, k, m;
  };
  for (Case cs : {Case{1, 7, 3}, Case{5, 64, 10}, Case{33, 129, 17}}) {
    auto at = r.scope("x" + dims({cs.n, cs.k}) + " w" + dims({cs.m, cs.k}));
    Tensor hx = host_plain({cs.n, cs.k}, 601), hw = host_plain({cs.m, cs.k}, 602);
    Tensor hb = host_plain({cs.m}, 603), hdy = host_plain({cs.n, cs.m}, 604);
    Tensor x = be->from_host(hx), w = be->from_host(hw), b = be->from_host(hb);
    Tensor xr = ref->from_host(hx), wr = ref->from_host(hw), br = ref->from_host(hb);
    r.near("linear_forward", be->linear_forward(x, w, b), ref->linear_forward(xr, wr, br), OpKind::linear);
    Tensor dw = be->zeros({cs.m, cs.k}), db = be->zeros({cs.m});
    Tensor dwr = ref->zeros({cs.m, cs.k}), dbr = ref->zeros({cs.m});
    r.poison(dw);
    r.poison(db);
    Tensor dx = be->linear_backward(be->from_host(hdy), x, w, dw, db, true);
    Tensor dxr = ref->linear_backward(ref->from_host(hdy), xr, wr, dwr, dbr, true);
    r.near("linear_backward dx", dx, dxr, OpKind::linear);
    r.near("linear_backward dw", dw, dwr, OpKind::linear);
    r.near("linear_backward db", db, dbr, OpKind::fp32_reduction);
    r.expect("linear_backward makes no dx when none is asked for",
             !be->linear_backward(be->from_host(hdy), x, w, dw, db, false).defined(), "it made one");
  }
}

// The loss at once and queued (its figures read later with queued_loss; a second queue
// replaces the first), with and without mixed targets.
void softmax_cross_entropy_at_once_and_queued(OpCaseRun& r) {
  Backend* be = r.be();
  Backend* ref = r.ref();
  struct Case {
    int64_t n, m;
    float smoothing, scale;
  };
  for (Case cs : {Case{1, 10, 0.f, 1.f}, Case{37, 10, 0.1f, 128.f}, Case{5, 1000, 0.1f, 1.f}}) {
    Tensor hz = host_plain({cs.n, cs.m}, 700 + uint64_t(cs.m), 3.f);
    std::vector<int32_t> labels, labels_b;
    std::vector<float> lam;
    Philox rng(701);
    for (int64_t i = 0; i < cs.n; ++i) {
      labels.push_back(int32_t(rng.below(uint32_t(cs.m))));
      labels_b.push_back(int32_t(rng.below(uint32_t(cs.m))));
      lam.push_back(rng.uniform());
    }
    const LabelMix mix{labels_b.data(), lam.data()};
    for (const LabelMix* mx : {static_cast<const LabelMix*>(nullptr), &mix}) {
      auto at = r.scope(str(dims({cs.n, cs.m}), " smoothing ", cs.smoothing, " scale ", cs.scale,
                            mx ? " mixed-targets" : " plain-labels"));
      Tensor dr;
      const LossResult lr = ref->softmax_xent(ref->from_host(hz), labels.data(), cs.smoothing, cs.scale, &dr, mx);
      // The figures of one form (`op`) against the reference's; its gradient where it made one.
      auto figures = [&](const std::string& op, const LossResult& got, const Tensor* grad) {
        r.near(op + " loss", rel_err(got.loss, lr.loss), r.tol(OpKind::loss_value));
        r.expect(op + " top1", got.top1 == lr.top1, str(got.top1, " where the reference counted ", lr.top1));
        r.expect(op + " top5", got.top5 == lr.top5, str(got.top5, " where the reference counted ", lr.top5));
        if (grad) r.near(op + " gradient", *grad, dr, OpKind::fp32_update);
      };
      Tensor d;
      figures("softmax_xent", be->softmax_xent(be->from_host(hz), labels.data(), cs.smoothing, cs.scale, &d, mx), &d);
      figures("softmax_xent without the gradient",
              be->softmax_xent(be->from_host(hz), labels.data(), cs.smoothing, cs.scale, nullptr, mx), nullptr);
      Tensor dq;
      be->softmax_xent_queue(be->from_host(host_plain({cs.n, cs.m}, 713)), labels.data(), 0.f, 1.f,
                             nullptr, mx);
      be->softmax_xent_queue(be->from_host(hz), labels.data(), cs.smoothing, cs.scale, &dq, mx);
      figures("softmax_xent_queue", be->queued_loss(), &dq);
    }
  }
}

// A row whose logits are NaN (a forward that overflowed at 16 bits) ranks its label last:
// it counts as wrong in top-1 and top-5, where a plain > comparison counted it right.
void non_finite_logits_count_as_wrong_predictions(OpCaseRun& r) {
  Backend* be = r.be();
  const int64_t n = 4, m = 10;
  auto at = r.scope(dims({n, m}) + " nan and inf logits");
  Tensor hz = host_plain({n, m}, 720);
  float* z = hz.data<float>();
  const std::vector<int32_t> labels = {3, 0, 9, 5};
  for (int64_t j = 0; j < m; ++j) z[j] = kNaN;  // row 0: all NaN
  z[1 * m + 0] = kNaN;                          // row 1: the label's logit NaN
  z[2 * m + 9] = 100.f;                         // row 2: right, by far
  z[2 * m + 4] = kInf;                          //   ... but inf elsewhere beats it
  z[3 * m + 5] = 100.f;                         // row 3: right
  const LossResult l = be->softmax_xent(be->from_host(hz), labels.data(), 0.f, 1.f, nullptr);
  r.expect("softmax_xent top1 counts only row 3 right", l.top1 == 1, str("top1 ", l.top1));
  r.expect("softmax_xent top5 counts rows 2 and 3 within the top five", l.top5 == 2, str("top5 ", l.top5));
  r.expect("softmax_xent loss is NaN", std::isnan(l.loss), str("loss ", l.loss));
}

// An optimizer's tensors, made from the same host values on the backend under test (p, g, m)
// and on the reference (pr, gr, mr), and its step: step(backend, p, g, m, i, skip) runs the
// i-th step (skip: with skip_on_overflow set) on that backend's tensors.
struct OptimizerRun {
  Tensor p, g, m, pr, gr, mr;
  std::function<void(Backend*, Tensor&, const Tensor&, Tensor&, int, bool)> step;
};
OptimizerRun optimizer_run(OpCaseRun& r, const Tensor& hp, const Tensor& hg, const Tensor& hm) {
  Backend* be = r.be();
  Backend* ref = r.ref();
  return {be->from_host(hp), be->from_host(hg), be->from_host(hm),
          ref->from_host(hp), ref->from_host(hg), ref->from_host(hm), nullptr};
}

// `steps` steps on both backends, then the parameters and the momentum against the
// reference's (and what `more` checks then). Then skip_on_overflow, as both optimizers' steps
// take it: after a queued non-finite verdict (`bad`: inf or NaN) the step leaves the parameters
// and the momentum as they were, on the device; after a finite verdict it steps as the
// reference does.
void optimizer_checks(OpCaseRun& r, const std::string& op, OptimizerRun& o, int steps, float bad, uint64_t seed,
                      const std::function<void()>& more = nullptr) {
  Backend* be = r.be();
  for (int i = 0; i < steps; ++i) {
    o.step(be, o.p, o.g, o.m, i, false);
    o.step(r.ref(), o.pr, o.gr, o.mr, i, false);
  }
  r.near(op + " parameters", o.p, o.pr, OpKind::fp32_update);
  r.near(op + " momentum", o.m, o.mr, OpKind::fp32_update);
  if (more) more();
  const int64_t n = o.p.numel();
  const std::vector<float> before = values(*be, o.p), before_m = values(*be, o.m);
  Tensor verdict = be->from_host(host_plain({n}, seed));
  be->fill(verdict, bad);
  be->unscale_check_queue(verdict, 1.f);
  o.step(be, o.p, o.g, o.m, steps - 1, true);
  r.expect(str("queued_overflow after ", std::isnan(bad) ? "a NaN" : "an inf"), be->queued_overflow(),
           "no overflow was queued");
  r.same(op + " skipped after an overflow verdict", values(*be, o.p), before);
  r.same(op + " momentum untouched after an overflow verdict", values(*be, o.m), before_m);
  Tensor fine = be->from_host(host_plain({n}, seed + 1));
  be->unscale_check_queue(fine, 1.f);
  o.step(be, o.p, o.g, o.m, steps - 1, true);
  o.step(r.ref(), o.pr, o.gr, o.mr, steps - 1, false);
  r.expect("queued_overflow after finite values", !be->queued_overflow(), "an overflow was queued");
  r.near(op + " after a finite verdict", o.p, o.pr, OpKind::fp32_update);
}

void sgd_per_segment_and_skipped_on_a_queued_overflow(OpCaseRun& r) {
  int64_t n = 3 * 8192 + 77;  // several chunks, a ragged tail
  std::vector<SgdSegment> segs = {{0, 1000, 1e-4f}, {1000, 20000, 0.f}, {21000, n - 21000, 5e-4f}};
  for (bool nesterov : {false, true}) {
    auto at = r.scope(str(dims({n}), " 3 segments", nesterov ? " nesterov" : ""));
    OptimizerRun o = optimizer_run(r, host_plain({n}, 801), host_plain({n}, 802), host_plain({n}, 803, 0.1f));
    o.step = [&](Backend* be, Tensor& p, const Tensor& g, Tensor& m, int, bool skip) {
      be->sgd_step(p, g, m, segs, SgdHyper{0.05f, 0.9f, nesterov, 0.5f, skip});
    };
    optimizer_checks(r, "sgd_step", o, 3, kInf, 804);
  }
}

// LARS: per-tensor trust ratios (one tensor of several chunks with a ragged tail, one of one
// chunk, small ones), tensors left out of the adaptation and the decay, a tensor whose gradient
// is zero and one whose weights are (trust 1, no division by zero); against the reference over
// steps of changing learning rates; then skipped, on the device, after a queued overflow verdict.
void lars_per_tensor_trust_ratios_and_skipped_on_a_queued_overflow(OpCaseRun& r) {
  std::vector<LarsSegment> segs;
  int64_t n = 0;
  auto add = [&](int64_t count, float wd, bool adapt) {
    segs.push_back(LarsSegment{n, count, wd, adapt});
    n += count;
  };
  add(3 * 8192 + 77, 5e-5f, true);   // 0: several chunks, a ragged tail
  add(300, 0.f, false);              // 1: batch norm and biases
  add(1000, 5e-5f, true);            // 2: its gradient is zero
  add(64, 5e-5f, true);              // 3: its weights are zero
  add(8192, 1e-4f, true);            // 4: one whole chunk
  add(10, 0.f, false);               // 5: left out
  add(129, 5e-5f, true);             // 6: small
  Tensor hp = host_plain({n}, 811), hg = host_plain({n}, 812), hm = host_plain({n}, 813, 0.01f);
  float* pp = hp.data<float>();
  float* pg = hg.data<float>();
  for (size_t k = 0; k < segs.size(); ++k)  // each tensor's gradient of its own size
    for (int64_t i = segs[k].offset; i < segs[k].offset + segs[k].count; ++i) pg[i] *= 0.02f * float(k + 1);
  for (int64_t i = segs[2].offset; i < segs[2].offset + segs[2].count; ++i) pg[i] = 0.f;
  for (int64_t i = segs[3].offset; i < segs[3].offset + segs[3].count; ++i) pp[i] = 0.f;
  const float lrs[] = {2.f, 5.f, 3.5f};
  for (bool nesterov : {false, true}) {
    auto at = r.scope(str(dims({n}), " 7 tensors", nesterov ? " nesterov" : ""));
    OptimizerRun o = optimizer_run(r, hp, hg, hm);
    o.step = [&](Backend* be, Tensor& p, const Tensor& g, Tensor& m, int i, bool skip) {
      be->lars_step(p, g, m, segs, LarsHyper{lrs[i], 0.9f, nesterov, 0.5f, skip, 0.001f, 1e-7f});
    };
    // The tensors of trust 1 moved by lr * (weight decay) alone (zero gradient) and by lr *
    // gradient from zero weights: finite, and as the reference has them.
    optimizer_checks(r, "lars_step", o, 3, kNaN, 814, [&] {
      const std::vector<float> got = values(*r.be(), o.p), want = values(*r.ref(), o.pr);
      for (size_t k : {size_t(2), size_t(3)}) {
        auto part = [&](const std::vector<float>& v) {
          return std::vector<float>(v.begin() + segs[k].offset, v.begin() + segs[k].offset + segs[k].count);
        };
        r.near(str("lars_step tensor ", k, k == 2 ? " (zero gradient)" : " (zero weights)"),
               nerr(part(got), part(want)), r.tol(OpKind::fp32_update));
      }
    });
  }
}

void unscale_and_check_at_once_and_queued(OpCaseRun& r) {
  Backend* be = r.be();
  int64_t n = 100003;
  auto at = r.scope(dims({n}));
  Tensor h = host_plain({n}, 901);
  Tensor t = be->from_host(h);
  r.expect("unscale_and_check finds finite values finite", !be->unscale_and_check(t, 0.25f), "it found an overflow");
  // Every 997th value (991st for the queued form) scaled exactly.
  auto sampled = [&](const std::vector<float>& got, float scale, int64_t step) {
    std::vector<float> g, w;
    for (int64_t i = 0; i < n; i += step) {
      g.push_back(got[size_t(i)]);
      w.push_back(h.data<float>()[i] * scale);
    }
    return std::pair{g, w};
  };
  auto [g1, w1] = sampled(values(*be, t), 0.25f, 997);
  r.same("unscale_and_check scales by 0.25", g1, w1);
  for (float bad : {kInf, -kInf, kNaN}) {
    for (int64_t pos : {int64_t(0), n / 2, n - 1}) {
      Tensor hb = host_plain({n}, 902);
      hb.data<float>()[pos] = bad;
      Tensor tb = be->from_host(hb);
      r.expect(str("unscale_and_check finds ", bad, " at ", pos), be->unscale_and_check(tb, 1.f),
               "it found none");
    }
  }
  Tensor big = be->from_host(host_plain({n}, 903, 1e30f));
  r.expect("unscale_and_check finds the product's own overflow", be->unscale_and_check(big, 1e10f),
           "it found none");
  r.expect("unscale_and_check keeps no stale verdict", !be->unscale_and_check(t, 1.f), "it found an overflow");
  // Queued: the same scaling and verdict, read with queued_overflow; a later queue replaces it.
  Tensor q = be->from_host(h);
  be->unscale_check_queue(q, 0.5f);
  r.expect("unscale_check_queue finds finite values finite", !be->queued_overflow(), "it found an overflow");
  auto [g2, w2] = sampled(values(*be, q), 0.5f, 991);
  r.same("unscale_check_queue scales by 0.5", g2, w2);
  Tensor hb = host_plain({n}, 905);
  hb.data<float>()[n / 3] = kNaN;
  Tensor tb = be->from_host(hb);
  be->unscale_check_queue(tb, 1.f);
  r.expect("unscale_check_queue finds a NaN", be->queued_overflow(), "it found none");
  be->unscale_check_queue(q, 1.f);
  r.expect("unscale_check_queue keeps no stale verdict", !be->queued_overflow(), "it found an overflow");
}

// The weights' moving average: dst += w * (src - dst).
void lerp_matches_the_reference(OpCaseRun& r) {
  Backend* be = r.be();
  Backend* ref = r.ref();
  const int64_t n = 3 * 8192 + 5;
  Tensor hd = host_plain({n}, 906), hs = host_plain({n}, 907);
  Tensor d = be->from_host(hd), s = be->from_host(hs), dr = ref->from_host(hd), sr = ref->from_host(hs);
  for (float w : {0.5f, 2e-4f, 1.f}) {
    auto at = r.scope(str(dims({n}), " w ", w));
    be->lerp(d, s, w);
    ref->lerp(dr, sr, w);
    r.near("lerp", d, dr, OpKind::fp32_update);
  }
}

// ---- data movement

// Uploads keep every value (rounded to the compute dtype), whichever layout the backend
// chose; zeros, fill and copy write every element; host copies into an existing buffer (at
// once, and queued into the backend's staging memory, waited for) equal to_host.
void uploads_copies_and_fills_keep_every_value(OpCaseRun& r) {
  Backend* be = r.be();
  Backend* ref = r.ref();
  const DType dt = r.dt();
  {
    const Shape s{2, 5, 7, 3};
    auto at = r.scope(dims(s));
    Tensor h = host_nhwc(s, 910);
    const std::vector<float> want = values(*ref, r.act_ref(h));
    r.near("upload_images", nerr(values(*be, be->upload_images(h, dt)), want), r.tol(OpKind::exact));
    r.near("upload_activation", nerr(values(*be, be->upload_activation(h, dt)), want), r.tol(OpKind::exact));
  }
  // 8-bit pixels, normalized on the way (fma(pixel, scale, shift) of its channel, rounded to
  // the compute dtype): every byte value, in every channel.
  for (int64_t c : {3, 1}) {
    const Shape ps{2, c, 16, 8};  // 256 pixels
    auto at = r.scope(dims(ps) + " every byte value");
    Tensor hu = Tensor::host(ps, DType::u8, Layout::nhwc);
    PixelNorm norm;
    for (int k = 0; k < 3; ++k) {
      norm.mean[k] = 0.4f + 0.03f * float(k);
      norm.std[k] = 0.22f + 0.01f * float(k);
    }
    uint8_t* pu = static_cast<uint8_t*>(hu.write_raw());
    for (int64_t i = 0; i < hu.numel(); ++i) pu[i] = uint8_t((i / c * 7) % 256);  // pixel p: 7p mod 256
    r.near("upload_pixels", be->upload_pixels(hu, norm, dt), ref->upload_pixels(hu, norm, dt), OpKind::rounding);
  }
  const int64_t n = 1 << 18;
  auto at = r.scope(dims({n}));
  Tensor hp = host_plain({n}, 911);
  Tensor src = be->from_host(hp);
  r.same("from_host", values(*be, src), values(*ref, ref->from_host(hp)));
  Tensor z = be->zeros({n});
  r.same("zeros", values(*be, z), std::vector<float>(size_t(n), 0.f));
  be->fill(z, 2.5f);
  r.same("fill", values(*be, z), std::vector<float>(size_t(n), 2.5f));
  be->copy(src, z);
  r.same("copy", values(*be, z), values(*be, src));
  const std::vector<float> vals = values(*be, src);
  Tensor pageable = Tensor::host({n});
  std::fill(pageable.data<float>(), pageable.data<float>() + n, kNaN);
  be->copy_to_host(src, pageable);
  r.expect("copy_to_host", std::memcmp(pageable.raw(), vals.data(), size_t(n) * 4) == 0,
           "the copy differs from to_host");
  Tensor staged({n}, DType::f32, be->host_staging_allocator());
  std::fill(staged.data<float>(), staged.data<float>() + n, kNaN);
  std::function<void()> wait = be->copy_to_host_async(src, staged);
  be->fill(src, 7.f);  // queued after the copy: the copy holds the values before it
  wait();
  r.expect("copy_to_host_async into staging memory", std::memcmp(staged.raw(), vals.data(), size_t(n) * 4) == 0,
           "the copy differs from to_host (or took the fill queued after it)");
}

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = {
      {"ConvolutionForwardBackwardDataAndWeights", convolution_forward_backward_data_and_weights},
      {"ConvolutionBackwardDataAddsIntoTheGivenGradient", convolution_backward_data_adds_into_the_given_gradient},
      {"BatchNormTrainBackwardRunningAndInference", batch_norm_train_backward_running_and_inference},
      {"ConvolutionWithBatchNormStatisticsAndPrologue", convolution_with_batch_norm_statistics_and_prologue},
      {"FusedPrologueHoldsAtPaddedAndStridedConvolutions", fused_prologue_holds_at_padded_and_strided_convolutions},
      {"BatchNormAddReluMatchesTheComposition", batch_norm_add_relu_matches_the_composition},
      {"MaxPoolAndGlobalAveragePool", max_pool_and_global_average_pool},
      {"MaxPoolRoutesEachWindowsGradientOnceOnTies", max_pool_routes_each_windows_gradient_once_on_ties},
      {"ReluAddAndTheirBackward", relu_add_and_their_backward},
      {"CastRoundTripsBitwiseLikeTheReference", cast_round_trips_bitwise_like_the_reference},
      {"LinearForwardAndBackward", linear_forward_and_backward},
      {"SoftmaxCrossEntropyAtOnceAndQueued", softmax_cross_entropy_at_once_and_queued},
      {"NonFiniteLogitsCountAsWrongPredictions", non_finite_logits_count_as_wrong_predictions},
      {"SgdPerSegmentAndSkippedOnAQueuedOverflow", sgd_per_segment_and_skipped_on_a_queued_overflow},
      {"LarsPerTensorTrustRatiosAndSkippedOnAQueuedOverflow",
       lars_per_tensor_trust_ratios_and_skipped_on_a_queued_overflow},
      {"UnscaleAndCheckAtOnceAndQueued", unscale_and_check_at_once_and_queued},
      {"LerpMatchesTheReference", lerp_matches_the_reference},
      {"UploadsCopiesAndFillsKeepEveryValue", uploads_copies_and_fills_keep_every_value},
  };
  return cases;
}

std::vector<OpCheck> run_op_case(const OpCase& c, Backend& be, Backend& ref, const OpTarget& t) {
  OpCaseRun r(be, ref, t, c.name);
  std::string error;
  try {
    c.run(r);
  } catch (const std::exception& e) {
    error = e.what();
  } catch (...) {
    error = "an exception that is not a std::exception";
  }
  std::vector<OpCheck> checks = r.checks();
  if (!error.empty()) {
    OpCheck f;
    f.op_case = c.name;
    f.target = t.name;
    f.what = str("case ", c.name);
    f.where = r.thrown_where();
    f.exact = true;
    f.ok = false;
    f.detail = "stopped by an error: " + error;
    checks.push_back(std::move(f));
  }
  return checks;
}

std::vector<OpCheck> run_op_cases(Backend& be, Backend& ref, const OpTarget& t, const std::string& filter) {
  std::vector<OpCheck> all;
  for (const OpCase& c : op_cases()) {
    if (!filter.empty() && std::string(c.name).find(filter) == std::string::npos) continue;
    std::vector<OpCheck> checks = run_op_case(c, be, ref, t);
    all.insert(all.end(), std::make_move_iterator(checks.begin()), std::make_move_iterator(checks.end()));
  }
  return all;
}

}  // namespace spotrain::health
