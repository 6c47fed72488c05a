// The op suite: every op of kernels/ops.h on the backend under test against the CPU reference,
// in each layout and precision the backend offers, as ggml's test-backend-ops does. The
// reference is the CPU backend in its own (blocked) layout computing in fp32 on the inputs
// rounded to the precision under test; results are compared by normalized error within a
// tolerance per precision, the outputs of a GPU poisoned (NaN bytes) before they are written.
//
// Backends under test: the CPU itself in the other layout (NHWC) and at 16 bits (bf16, fp16:
// 16-bit storage, its own casts and fp32 fallbacks), which CI runs on every commit, so the
// suite's own logic, layouts and references are tried before a GPU ever sees them; and the
// CUDA backend (fp32, tf32, bf16, fp16), which skips without a GPU. The reference refuses
// operands in mixed layouts, so a test that feeds it an activation in the wrong layout fails
// here (two such test bugs once reached an H200). tests/check_op_coverage.cmake checks that
// every op of kernels/ops.h is called here on the backend under test (`be->op(`).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/philox.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/ops.h"

using namespace spotrain;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// One backend under test: a device, the CPU's activation layout, a precision, and the
// normalized error allowed for GEMM-like ops (conv, linear, batch norm) against the fp32
// reference.
struct Target {
  const char* name;
  const char* device;  // "cpu" or "cuda"
  Layout layout;       // the CPU's activations (the GPU's are NHWC)
  DType dt;
  bool tf32;
  double tol;
};
void PrintTo(const Target& t, std::ostream* os) { *os << t.device << "_" << t.name; }

const Target kCpuTargets[] = {
    {"nhwc_fp32", "cpu", Layout::nhwc, DType::f32, false, 1e-5},
    {"nhwc_bf16", "cpu", Layout::nhwc, DType::bf16, false, 3e-2},
    {"nhwc_fp16", "cpu", Layout::nhwc, DType::f16, false, 5e-3},
    {"blocked_bf16", "cpu", Layout::blocked, DType::bf16, false, 3e-2},
    {"blocked_fp16", "cpu", Layout::blocked, DType::f16, false, 5e-3},
};
const Target kCudaTargets[] = {
    {"fp32", "cuda", Layout::nhwc, DType::f32, false, 1e-4},
    {"tf32", "cuda", Layout::nhwc, DType::f32, true, 5e-3},
    {"bf16", "cuda", Layout::nhwc, DType::bf16, false, 3e-2},
    {"fp16", "cuda", Layout::nhwc, DType::f16, false, 5e-3},
};
std::string target_name(const ::testing::TestParamInfo<Target>& i) { return i.param.name; }

std::vector<float> normals(int64_t n, uint64_t seed, float scale = 1.f, float shift = 0.f) {
  Philox rng(seed, 77);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = rng.normal() * scale + shift;
  return v;
}

// Host fp32 tensors: 4-D ones NHWC (the logical (N, C, H, W) filled from `v` in memory
// order, which is all a random input needs), others plain.
Tensor host_nhwc(const Shape& s, uint64_t seed, float scale = 1.f) {
  Tensor t = Tensor::host(s, DType::f32, Layout::nhwc);
  auto v = normals(t.numel(), seed, scale);
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}
Tensor host_plain(const Shape& s, uint64_t seed, float scale = 1.f, float shift = 0.f) {
  Tensor t = Tensor::host(s);
  auto v = normals(t.numel(), seed, scale, shift);
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

// Like host_nhwc, but no two elements of one (n, c) plane within 250 pixels of each other
// are equal, and all are exact in bf16 and fp16: max pooling then has no ties, whose
// gradient each backend may route differently.
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

// Any tensor's values in canonical order (4-D: NCHW), whatever its device and layout.
std::vector<float> values(Backend& be, const Tensor& t) {
  Tensor h = be.to_host(t);
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

// ||got - want|| / ||want||; infinite when got has a NaN or inf where want has none (an
// unwritten, poisoned element) or the sizes differ.
double nerr(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return kInf;
  double d = 0, w = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isfinite(want[i]) && !std::isfinite(got[i])) return kInf;
    d += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    w += double(want[i]) * want[i];
  }
  return std::sqrt(d) / std::max(std::sqrt(w), 1e-30);
}

// Storage rounding: the tolerance of elementwise results in dt.
double elem_tol(DType dt) { return dt == DType::bf16 ? 8e-3 : dt == DType::f16 ? 1e-3 : 1e-6; }

// Batch-norm parameters and their gradients as unaligned views of one flat buffer, as in a
// Model: gamma and beta hold hg and hb.
struct BnParams {
  Tensor flat, gamma, beta, dgamma, dbeta;
};
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

class BackendOps : public ::testing::TestWithParam<Target> {
 protected:
  void SetUp() override {
    const Target& t = GetParam();
    if (std::string(t.device) == "cuda" && !cuda_backend_ready()) GTEST_SKIP() << "no CUDA device";
    BackendOptions o;
    o.threads = 2;
    o.tf32 = t.tf32;
    o.poison = true;
    o.cpu_activations = t.layout;
    be = make_backend(t.device, o);
    BackendOptions r;
    r.threads = 2;
    ref = make_backend("cpu", r);
    dt = t.dt;
    tol = t.tol;
  }
  bool on_gpu() const { return be->device() == Device::cuda; }

  // An activation of host values h, as an op in the middle of a network receives it: on the
  // backend under test in dt; on the reference the same values rounded to dt, in fp32.
  Tensor act(const Tensor& h) { return be->upload_activation(h, dt); }
  Tensor act_ref(const Tensor& h) { return ref->cast(ref->upload_activation(h, dt), DType::f32); }
  // The error of `got` (on the backend under test) against `want` (on the reference).
  double err(const Tensor& got, const Tensor& want) {
    return nerr(values(*be, got), values(*ref, want));
  }
  // NaN into an output the op must overwrite (a parameter gradient).
  void poison(Tensor& t) { be->fill(t, kNaN); }

  std::unique_ptr<Backend> be, ref;
  DType dt = DType::f32;
  double tol = 0;
};

// ---- convolution -----------------------------------------------------------------------

struct ConvCase {
  Shape x;  // (N, C, H, W)
  int out, k, stride, pad;
};

// Forward, backward-data and backward-weights, then the forward again with the weights'
// cached compute copy, and after a copy into the weights (which must refresh that copy).
TEST_P(BackendOps, ConvolutionForwardBackwardDataAndWeights) {
  const ConvCase cases[] = {
      {{1, 3, 7, 5}, 5, 3, 1, 1},    // batch 1, odd sizes
      {{2, 16, 9, 9}, 8, 3, 2, 1},   // strided
      {{3, 8, 6, 6}, 16, 1, 1, 0},   // 1x1
      {{2, 3, 17, 17}, 8, 7, 2, 3},  // stem-like
      {{1, 5, 4, 3}, 7, 1, 2, 0},    // 1x1 strided, odd channels
  };
  uint64_t seed = 100;
  for (const auto& cc : cases) {
    SCOPED_TRACE(shape_str(cc.x) + " k" + std::to_string(cc.k) + " s" + std::to_string(cc.stride));
    ConvParams p{cc.k, cc.k, cc.stride, cc.pad};
    Shape ws{cc.out, cc.x[1], cc.k, cc.k};
    Tensor hx = host_nhwc(cc.x, ++seed);
    Tensor hw = host_plain(ws, ++seed, 1.f / std::sqrt(float(cc.x[1] * cc.k * cc.k)));
    // The first layer's input (upload_images) and a later layer's (upload_activation).
    for (bool first : {true, false}) {
      SCOPED_TRACE(first ? "as the first layer" : "as a later layer");
      Tensor x = first ? be->upload_images(hx, dt) : act(hx), xr = act_ref(hx);
      Tensor w = be->from_host(hw), wr = ref->from_host(hw);
      Tensor y = be->conv2d_forward(x, w, p), yr = ref->conv2d_forward(xr, wr, p);
      ASSERT_EQ(y.shape(), yr.shape());
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_LE(err(y, yr), tol);
      Tensor hdy = host_nhwc(yr.shape(), ++seed);
      Tensor dy = act(hdy), dyr = act_ref(hdy);
      Tensor dx = be->conv2d_backward_data(dy, w, x, p), dxr = ref->conv2d_backward_data(dyr, wr, xr, p);
      EXPECT_EQ(dx.shape(), x.shape());
      EXPECT_LE(err(dx, dxr), tol);
      Tensor dw = be->zeros(ws), dwr = ref->zeros(ws);
      poison(dw);
      be->conv2d_backward_weights(x, dy, p, dw);
      ref->conv2d_backward_weights(xr, dyr, p, dwr);
      EXPECT_LE(err(dw, dwr), tol);
      EXPECT_LE(err(be->conv2d_forward(x, w, p), yr), tol) << "with the cached weights";
      Tensor hw2 = host_plain(ws, ++seed);
      be->copy(be->from_host(hw2), w);
      ref->copy(ref->from_host(hw2), wr);
      EXPECT_LE(err(be->conv2d_forward(x, w, p), ref->conv2d_forward(xr, wr, p)), tol)
          << "after the weights changed";
    }
  }
}

// acc += backward-data (cuDNN's beta = 1), first at a shape's first use (the algorithm search
// must not overwrite acc), then again with the algorithm chosen.
TEST_P(BackendOps, ConvolutionBackwardDataAddsIntoTheGivenGradient) {
  const ConvCase cases[] = {{{4, 32, 14, 14}, 64, 1, 1, 0}, {{2, 16, 9, 9}, 8, 3, 2, 1}};
  uint64_t seed = 700;
  for (const auto& cc : cases) {
    SCOPED_TRACE(shape_str(cc.x) + " k" + std::to_string(cc.k));
    ConvParams p{cc.k, cc.k, cc.stride, cc.pad};
    Shape ws{cc.out, cc.x[1], cc.k, cc.k};
    Tensor hx = host_nhwc(cc.x, ++seed);
    Tensor hw = host_plain(ws, ++seed, 1.f / std::sqrt(float(cc.x[1] * cc.k * cc.k)));
    Tensor x = act(hx), xr = act_ref(hx);
    Tensor w = be->from_host(hw), wr = ref->from_host(hw);
    Tensor yr = ref->conv2d_forward(xr, wr, p);
    Tensor hdy = host_nhwc(yr.shape(), ++seed);
    Tensor dy = act(hdy), dyr = act_ref(hdy);
    for (int round = 0; round < 2; ++round) {
      Tensor hacc = host_nhwc(cc.x, ++seed);
      Tensor acc = act(hacc), accr = act_ref(hacc);
      be->conv2d_backward_data_add(dy, w, x, p, acc);
      ref->conv2d_backward_data_add(dyr, wr, xr, p, accr);
      EXPECT_EQ(acc.shape(), x.shape());
      EXPECT_LE(err(acc, accr), std::max(tol, 2 * elem_tol(dt))) << "round " << round;
    }
  }
}

// ---- batch norm ------------------------------------------------------------------------------

TEST_P(BackendOps, BatchNormTrainBackwardRunningAndInference) {
  const Shape shapes[] = {{1, 3, 5, 7}, {4, 16, 6, 6}, {2, 64, 3, 3}, {8, 5, 1, 1}};
  uint64_t seed = 200;
  const double t = std::max(tol, 10 * elem_tol(dt));
  for (const Shape& s : shapes) {
    for (bool relu : {false, true}) {
      SCOPED_TRACE(shape_str(s) + (relu ? " relu" : ""));
      int64_t C = s[1];
      Tensor hx = host_nhwc(s, ++seed, 2.f);
      Tensor hg = host_plain({C}, ++seed, 0.2f, 1.f), hb = host_plain({C}, ++seed, 0.5f);
      Tensor x = act(hx), xr = act_ref(hx);
      BnParams pb = bn_params(*be, hg, hb), pr = bn_params(*ref, hg, hb);
      BnSaved sb, sr;
      Tensor y = be->batchnorm_forward_train(x, pb.gamma, pb.beta, 1e-5f, relu, sb);
      Tensor yr = ref->batchnorm_forward_train(xr, pr.gamma, pr.beta, 1e-5f, relu, sr);
      EXPECT_LE(err(y, yr), t);
      EXPECT_LE(err(sb.mean, sr.mean), t);
      EXPECT_LE(err(sb.var, sr.var), t);
      Tensor hdy = host_nhwc(s, ++seed);
      Tensor dy = act(hdy), dyr = act_ref(hdy);
      poison(pb.dgamma);
      poison(pb.dbeta);
      Tensor dx = be->batchnorm_backward(dy, x, pb.gamma, pb.beta, sb, 1e-5f, relu, pb.dgamma, pb.dbeta);
      Tensor dxr = ref->batchnorm_backward(dyr, xr, pr.gamma, pr.beta, sr, 1e-5f, relu, pr.dgamma, pr.dbeta);
      EXPECT_LE(err(dx, dxr), 2 * t);
      EXPECT_LE(err(pb.dgamma, pr.dgamma), 2 * t);
      EXPECT_LE(err(pb.dbeta, pr.dbeta), 2 * t);
      // Running statistics, then inference with them.
      Tensor hrm = host_plain({C}, ++seed, 0.1f), hrv = host_plain({C}, ++seed, 0.1f, 1.f);
      Tensor rm = be->from_host(hrm), rv = be->from_host(hrv);
      Tensor rmr = ref->from_host(hrm), rvr = ref->from_host(hrv);
      int64_t n = s[0] * s[2] * s[3];
      be->batchnorm_update_running(rm, rv, sb, 0.1f, n);
      ref->batchnorm_update_running(rmr, rvr, sr, 0.1f, n);
      EXPECT_LE(err(rm, rmr), t);
      EXPECT_LE(err(rv, rvr), t);
      Tensor i = be->batchnorm_forward_infer(x, pb.gamma, pb.beta, rm, rv, 1e-5f, relu);
      Tensor ir = ref->batchnorm_forward_infer(xr, pr.gamma, pr.beta, rmr, rvr, 1e-5f, relu);
      EXPECT_LE(err(i, ir), t);
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

// conv2d_backward_bn_relu on both backends from the output gradient `hdy`, the outputs under
// test poisoned first: x's gradient, dw, dgamma and dbeta against the reference's.
void expect_fused_backward_close(Backend* be, Backend* ref, const FusedBackwardArgs& a,
                                 const FusedBackwardArgs& ar, const Tensor& hdy,
                                 const ConvParams& p, double tol) {
  Tensor dy = be->upload_activation(hdy, a.x.dtype());
  Tensor dyr = ref->cast(ref->upload_activation(hdy, a.x.dtype()), DType::f32);
  Tensor dw = be->zeros(a.w.shape()), dwr = ref->zeros(ar.w.shape());
  be->fill(dw, kNaN);
  be->fill(a.bn.dgamma, kNaN);
  be->fill(a.bn.dbeta, kNaN);
  Tensor dx = be->conv2d_backward_bn_relu(dy, a.w, a.x, p, a.pro, a.saved, dw, a.bn.dgamma, a.bn.dbeta);
  Tensor dxr = ref->conv2d_backward_bn_relu(dyr, ar.w, ar.x, p, ar.pro, ar.saved, dwr, ar.bn.dgamma,
                                            ar.bn.dbeta);
  auto e = [&](const Tensor& g, const Tensor& w) { return nerr(values(*be, g), values(*ref, w)); };
  EXPECT_LE(e(dx, dxr), 4 * tol) << "dx";
  EXPECT_LE(e(dw, dwr), 2 * tol) << "dw";
  EXPECT_LE(e(a.bn.dgamma, ar.bn.dgamma), 4 * tol) << "dgamma";
  EXPECT_LE(e(a.bn.dbeta, ar.bn.dbeta), 4 * tol) << "dbeta";
}

// Conv + batch-norm fusion (--fusion bn): the convolution with the statistics of its output,
// without and then with the previous batch norm and ReLU applied as it reads, and the backward
// through both at once; the batch-norm backward and the running statistics run from those
// statistics. At 16 bits a GPU runs cuDNN's graph where it takes the shape (kernel_choices
// says "ran"), else the composition; the CPU composes.
TEST_P(BackendOps, ConvolutionWithBatchNormStatisticsAndPrologue) {
  const Shape xs{4, 32, 10, 10};
  const int64_t K = 64;
  const float eps = 1e-5f;
  const ConvParams p3{3, 3, 1, 1}, p1{1, 1, 1, 0};
  Tensor hx = host_nhwc(xs, 340);
  Tensor hw1 = host_plain({K, xs[1], 3, 3}, 341, 1.f / std::sqrt(float(xs[1] * 9)));
  Tensor hw2 = host_plain({K, K, 1, 1}, 342, 1.f / std::sqrt(float(K)));
  Tensor x = act(hx), xr = act_ref(hx);
  Tensor w1 = be->from_host(hw1), w1r = ref->from_host(hw1);
  Tensor w2 = be->from_host(hw2), w2r = ref->from_host(hw2);
  // conv1 with bn1's statistics
  BnSaved s1, s1r;
  Tensor y1 = be->conv2d_forward_bn_stats(x, w1, p3, nullptr, eps, &s1);
  Tensor y1r = ref->conv2d_forward_bn_stats(xr, w1r, p3, nullptr, eps, &s1r);
  const double t = std::max(tol, 10 * elem_tol(dt));
  EXPECT_LE(err(y1, y1r), t);
  EXPECT_LE(err(s1.mean, s1r.mean), t);
  EXPECT_LE(err(s1.var, s1r.var), t);
  // conv2 applying bn1 and its ReLU as it reads y1 (each backend its own y1 and statistics),
  // with the statistics of its own output
  BnParams pb = bn_params(*be, host_plain({K}, 343, 0.2f, 1.f), host_plain({K}, 344, 0.5f));
  BnParams pr = bn_params(*ref, host_plain({K}, 343, 0.2f, 1.f), host_plain({K}, 344, 0.5f));
  BnApply ab{pb.gamma, pb.beta, s1.mean, s1.var, eps}, ar{pr.gamma, pr.beta, s1r.mean, s1r.var, eps};
  BnSaved s2, s2r;
  Tensor y2 = be->conv2d_forward_bn_stats(y1, w2, p1, &ab, eps, &s2);
  Tensor y2r = ref->conv2d_forward_bn_stats(y1r, w2r, p1, &ar, eps, &s2r);
  EXPECT_LE(err(y2, y2r), 2 * t);
  EXPECT_LE(err(s2.mean, s2r.mean), 2 * t);
  EXPECT_LE(err(s2.var, s2r.var), 2 * t);
  // the same without the statistics (a block's last convolution)
  EXPECT_LE(err(be->conv2d_forward_bn_stats(y1, w2, p1, &ab, eps, nullptr), y2r), 2 * t);
  // Backward through conv2 and bn1 + ReLU at once, from the statistics conv1 made
  BnParams qb = bn_params(*be, host_plain({K}, 343, 0.2f, 1.f), host_plain({K}, 344, 0.5f));
  BnParams qr = bn_params(*ref, host_plain({K}, 343, 0.2f, 1.f), host_plain({K}, 344, 0.5f));
  expect_fused_backward_close(be.get(), ref.get(), {w2, y1, ab, s1, qb}, {w2r, y1r, ar, s1r, qr},
                              host_nhwc(y2r.shape(), 346), p1, t);
  // bn1's backward from the statistics conv1 made, and its running statistics
  Tensor hdy = host_nhwc(y1r.shape(), 345);
  Tensor dy = act(hdy), dyr = act_ref(hdy);
  poison(pb.dgamma);
  poison(pb.dbeta);
  Tensor dx = be->batchnorm_backward(dy, y1, pb.gamma, pb.beta, s1, eps, false, pb.dgamma, pb.dbeta);
  Tensor dxr = ref->batchnorm_backward(dyr, y1r, pr.gamma, pr.beta, s1r, eps, false, pr.dgamma, pr.dbeta);
  EXPECT_LE(err(dx, dxr), 2 * t);
  EXPECT_LE(err(pb.dgamma, pr.dgamma), 2 * t);
  EXPECT_LE(err(pb.dbeta, pr.dbeta), 2 * t);
  Tensor rm = be->zeros({K}), rv = be->zeros({K}), rmr = ref->zeros({K}), rvr = ref->zeros({K});
  be->batchnorm_update_running(rm, rv, s1, 0.1f, xs[0] * xs[2] * xs[3]);
  ref->batchnorm_update_running(rmr, rvr, s1r, 0.1f, xs[0] * xs[2] * xs[3]);
  EXPECT_LE(err(rm, rmr), t);
  EXPECT_LE(err(rv, rvr), t);
  if (!on_gpu()) return;
  // What ran, per shape (printed: which graphs this GPU and cuDNN take is what the test is
  // for on a new one): conv1's statistics graph and conv2's prologue graph and backward graphs
  // ran where cuDNN accepted them; fp32 has none.
  auto verdict = [&](const char* input, const char* graph) {
    for (const std::string& l : be->kernel_choices()) {
      if (l.rfind("conv ", 0) != 0 || l.find(input) == std::string::npos) continue;
      std::printf("  %s\n", l.c_str());
      size_t at = l.find(std::string(", ") + graph + " graph: ");
      return at == std::string::npos ? std::string("none") : l.substr(at, l.find(')', at) - at);
    }
    return std::string("no such shape");
  };
  for (auto [input, graph] : {std::pair{",4,32,10,10|", "conv+stats"},
                              std::pair{",4,64,10,10|", "bn-relu+conv+stats"},
                              std::pair{",4,64,10,10|", "bn-relu+conv"},
                              std::pair{",4,64,10,10|", "bn-relu+wgrad"},
                              std::pair{",4,64,10,10|", "dgrad+drelu+dbn"}}) {
    const std::string v = verdict(input, graph);
    if (dt == DType::f32) {
      EXPECT_EQ(v, "none") << input;
    } else {
      const bool accepted = v.find("graph: accepted") != std::string::npos;
      EXPECT_EQ(v.find(", ran") != std::string::npos, accepted) << v;
      EXPECT_TRUE(accepted || v.find("graph: refused") != std::string::npos) << v;
    }
  }
}

// The prologue where padding and stride matter (a block's 3x3 convolution, stride 1 and 2):
// the padded border must read zeros, not relu(bias), in the forward, the weight gradient and
// the data gradient; a batch-norm shift well above zero, so relu(bias) at the border shows.
TEST_P(BackendOps, FusedPrologueHoldsAtPaddedAndStridedConvolutions) {
  const Shape xs{4, 32, 9, 9};
  const float eps = 1e-5f;
  const double t = std::max(tol, 10 * elem_tol(dt));
  uint64_t seed = 900;
  for (int stride : {1, 2}) {
    SCOPED_TRACE("3x3 stride " + std::to_string(stride));
    const ConvParams p{3, 3, stride, 1};
    const int64_t C = xs[1], K = 48;
    // x plays the batch norm's input, its batch statistics made by each backend's own
    // batch-norm forward
    Tensor hx = host_nhwc(xs, ++seed);
    Tensor x = act(hx), xr = act_ref(hx);
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
    EXPECT_LE(err(y, yr), 2 * t);
    EXPECT_LE(err(s2.mean, s2r.mean), 2 * t);
    EXPECT_LE(err(s2.var, s2r.var), 2 * t);
    EXPECT_LE(err(be->conv2d_forward_bn_stats(x, w, p, &ab, eps, nullptr), yr), 2 * t);
    expect_fused_backward_close(be.get(), ref.get(), {w, x, ab, sb, pb}, {wr, xr, ar, sr, pr},
                                host_nhwc(yr.shape(), ++seed), p, t);
  }
  if (on_gpu())
    for (const std::string& l : be->kernel_choices())
      if (l.rfind("conv ", 0) == 0) std::printf("  %s\n", l.c_str());
}

// relu(bn(x) + z), a residual block's tail (cuDNN's fused BN_ADD_ACTIVATION, or the
// composition where a backend has none or cuDNN refuses a shape). z is chosen so that no
// bn(x) + z lies within 0.05 of zero: a composition at 16 bits rounds bn(x) before the add,
// and outputs that close to zero could change sign, with them the ReLU mask and the gradient.
TEST_P(BackendOps, BatchNormAddReluMatchesTheComposition) {
  const Shape shapes[] = {{8, 64, 14, 14}, {4, 256, 7, 7}, {2, 6, 3, 3}};
  uint64_t seed = 900;
  const double t = std::max(tol, 10 * elem_tol(dt));
  for (const Shape& s : shapes) {
    SCOPED_TRACE(shape_str(s));
    int64_t C = s[1];
    Tensor hx = host_nhwc(s, ++seed, 2.f), hz = host_nhwc(s, ++seed);
    Tensor hg = host_plain({C}, ++seed, 0.2f, 1.f), hb = host_plain({C}, ++seed, 0.5f);
    Tensor x = act(hx), xr = act_ref(hx);
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
    Tensor z = act(hz), zr = act_ref(hz);
    BnSaved sb, sr;
    Tensor y = be->batchnorm_add_relu_forward_train(x, z, pb.gamma, pb.beta, 1e-5f, sb);
    Tensor yr = ref->batchnorm_add_relu_forward_train(xr, zr, pr.gamma, pr.beta, 1e-5f, sr);
    EXPECT_LE(err(y, yr), t);
    EXPECT_LE(err(sb.mean, sr.mean), t);
    EXPECT_LE(err(sb.var, sr.var), t);
    Tensor hdy = host_nhwc(s, ++seed);
    Tensor dy = act(hdy), dyr = act_ref(hdy);
    poison(pb.dgamma);
    poison(pb.dbeta);
    Tensor dz, dzr;
    Tensor dx = be->batchnorm_add_relu_backward(dy, x, pb.gamma, pb.beta, sb, 1e-5f, pb.dgamma, pb.dbeta, dz);
    Tensor dxr = ref->batchnorm_add_relu_backward(dyr, xr, pr.gamma, pr.beta, sr, 1e-5f, pr.dgamma, pr.dbeta, dzr);
    EXPECT_LE(err(dz, dzr), t);
    EXPECT_LE(err(dx, dxr), 2 * t);
    EXPECT_LE(err(pb.dgamma, pr.dgamma), 2 * t);
    EXPECT_LE(err(pb.dbeta, pr.dbeta), 2 * t);
  }
}

// ---- pooling -------------------------------------------------------------------------------

TEST_P(BackendOps, MaxPoolAndGlobalAveragePool) {
  const Shape shapes[] = {{1, 3, 6, 5}, {2, 8, 9, 9}, {3, 16, 4, 4}, {2, 64, 17, 16}};
  uint64_t seed = 300;
  const double t = elem_tol(dt);
  for (const Shape& s : shapes) {
    SCOPED_TRACE(shape_str(s));
    PoolParams p{3, 2, 1};
    Tensor hx = host_nhwc_distinct(s, ++seed);
    Tensor x = act(hx), xr = act_ref(hx);
    Tensor ws, wsr;
    Tensor y = be->maxpool_forward(x, p, ws), yr = ref->maxpool_forward(xr, p, wsr);
    ASSERT_EQ(y.shape(), yr.shape());
    EXPECT_LE(err(y, yr), t);
    Tensor hdy = host_nhwc(yr.shape(), ++seed);
    Tensor dy = act(hdy), dyr = act_ref(hdy);
    EXPECT_LE(err(be->maxpool_backward(dy, x, ws, p), ref->maxpool_backward(dyr, xr, wsr, p)), t);
    Tensor g = be->global_avgpool_forward(x), gr = ref->global_avgpool_forward(xr);
    EXPECT_EQ(g.dtype(), DType::f32);
    EXPECT_LE(err(g, gr), 1e-5);
    Tensor hd = host_plain({s[0], s[1]}, ++seed);
    Tensor gb = be->global_avgpool_backward(be->from_host(hd), x);
    Tensor gbr = ref->global_avgpool_backward(ref->from_host(hd), xr);
    EXPECT_EQ(gb.dtype(), dt);
    EXPECT_LE(err(gb, gbr), t);
  }
}

// Ties, as after a ReLU (a window of zeros): each window's gradient goes to exactly one of
// its inputs, so the gradient is conserved: sum(dx) == sum(dy).
TEST_P(BackendOps, MaxPoolRoutesEachWindowsGradientOnceOnTies) {
  for (const Shape& s : {Shape{2, 16, 9, 9}, Shape{1, 3, 8, 7}}) {
    SCOPED_TRACE(shape_str(s));
    PoolParams p{3, 2, 1};
    Tensor hx = Tensor::host(s, DType::f32, Layout::nhwc);
    std::memset(hx.raw(), 0, hx.nbytes());
    Tensor ws;
    Tensor x = act(hx);
    Tensor y = be->maxpool_forward(x, p, ws);
    Tensor hdy = Tensor::host(y.shape(), DType::f32, Layout::nhwc);
    for (int64_t i = 0; i < hdy.numel(); ++i) hdy.data<float>()[i] = float(1 + i % 7);  // exact
    Tensor dx = be->maxpool_backward(act(hdy), x, ws, p);
    double sdx = 0, sdy = 0;
    for (float v : values(*be, dx)) sdx += v;
    for (int64_t i = 0; i < hdy.numel(); ++i) sdy += hdy.data<float>()[i];
    EXPECT_EQ(sdx, sdy);
  }
}

// ---- elementwise ---------------------------------------------------------------------------

// ReLU is exact in any dtype (the reference's fp32 ReLU of the rounded values is
// representable); Add rounds once.
TEST_P(BackendOps, ReluAddAndTheirBackward) {
  for (const Shape& s : {Shape{1, 3, 5, 7}, Shape{4, 33, 7, 3}}) {
    SCOPED_TRACE(shape_str(s));
    Tensor ha = host_nhwc(s, 401), hb = host_nhwc(s, 402), hd = host_nhwc(s, 403);
    Tensor a = act(ha), ar = act_ref(ha), b = act(hb), br = act_ref(hb), d = act(hd), dr = act_ref(hd);
    Tensor r = be->relu_forward(a), rr = ref->relu_forward(ar);
    EXPECT_EQ(err(r, rr), 0.0);
    EXPECT_EQ(err(be->relu_backward(d, r), ref->relu_backward(dr, rr)), 0.0);
    for (bool relu : {false, true}) {
      Tensor y = be->add_forward(a, b, relu), yr = ref->add_forward(ar, br, relu);
      EXPECT_LE(err(y, yr), elem_tol(dt));
      // The mask of y as written (rounded): taken from the reference's fp32 sum, a rounding
      // to zero could differ; the gradient itself passes dy unchanged.
      EXPECT_LE(err(be->add_backward(d, y, relu), ref->add_backward(dr, yr, relu)), 2 * elem_tol(dt));
    }
  }
}

// Casts round to nearest even, overflow fp16 to inf and keep NaN, exactly as the reference.
TEST_P(BackendOps, CastRoundTripsBitwiseLikeTheReference) {
  std::vector<float> v = normals(4099, 501, 1e4f);  // overflows fp16 at the tails
  v[7] = kNaN;
  v[8] = kInf;
  v[9] = 1e-7f;  // fp16 subnormal
  Tensor h = Tensor::host({int64_t(v.size())});
  std::memcpy(h.raw(), v.data(), v.size() * 4);
  for (DType to : {DType::bf16, DType::f16}) {
    auto got = values(*be, be->cast(be->cast(be->from_host(h), to), DType::f32));
    auto want = values(*ref, ref->cast(ref->cast(ref->from_host(h), to), DType::f32));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isnan(want[i]))
        EXPECT_TRUE(std::isnan(got[i])) << i;
      else
        EXPECT_EQ(std::memcmp(&want[i], &got[i], 4), 0) << i << ": " << got[i] << " vs " << want[i];
    }
  }
}

// ---- fp32 ops: Linear, loss, optimizer, overflow check ----------------------------------------

TEST_P(BackendOps, LinearForwardAndBackward) {
  const double t = GetParam().tf32 ? 5e-3 : 1e-5;
  struct Case {
    int64_t n, k, m;
  };
  for (Case cs : {Case{1, 7, 3}, Case{5, 64, 10}, Case{33, 129, 17}}) {
    SCOPED_TRACE(std::to_string(cs.n) + "x" + std::to_string(cs.k) + "x" + std::to_string(cs.m));
    Tensor hx = host_plain({cs.n, cs.k}, 601), hw = host_plain({cs.m, cs.k}, 602);
    Tensor hb = host_plain({cs.m}, 603), hdy = host_plain({cs.n, cs.m}, 604);
    Tensor x = be->from_host(hx), w = be->from_host(hw), b = be->from_host(hb);
    Tensor xr = ref->from_host(hx), wr = ref->from_host(hw), br = ref->from_host(hb);
    EXPECT_LE(err(be->linear_forward(x, w, b), ref->linear_forward(xr, wr, br)), t);
    Tensor dw = be->zeros({cs.m, cs.k}), db = be->zeros({cs.m});
    Tensor dwr = ref->zeros({cs.m, cs.k}), dbr = ref->zeros({cs.m});
    poison(dw);
    poison(db);
    Tensor dx = be->linear_backward(be->from_host(hdy), x, w, dw, db, true);
    Tensor dxr = ref->linear_backward(ref->from_host(hdy), xr, wr, dwr, dbr, true);
    EXPECT_LE(err(dx, dxr), t);
    EXPECT_LE(err(dw, dwr), t);
    EXPECT_LE(err(db, dbr), 1e-5);
    EXPECT_FALSE(be->linear_backward(be->from_host(hdy), x, w, dw, db, false).defined());
  }
}

// The loss at once and queued (its figures read later with queued_loss; a second queue
// replaces the first), with and without mixed targets.
TEST_P(BackendOps, SoftmaxCrossEntropyAtOnceAndQueued) {
  struct Case {
    int64_t n, m;
    float smoothing, scale;
  };
  for (Case cs : {Case{1, 10, 0.f, 1.f}, Case{37, 10, 0.1f, 128.f}, Case{5, 1000, 0.1f, 1.f}}) {
    SCOPED_TRACE(std::to_string(cs.n) + "x" + std::to_string(cs.m));
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
      SCOPED_TRACE(mx ? "mixed targets" : "plain labels");
      Tensor d, dr;
      LossResult r = be->softmax_xent(be->from_host(hz), labels.data(), cs.smoothing, cs.scale, &d, mx);
      LossResult rr = ref->softmax_xent(ref->from_host(hz), labels.data(), cs.smoothing, cs.scale, &dr, mx);
      EXPECT_NEAR(r.loss, rr.loss, 1e-9 * std::fabs(rr.loss));
      EXPECT_EQ(r.top1, rr.top1);
      EXPECT_EQ(r.top5, rr.top5);
      EXPECT_LE(err(d, dr), 1e-6);
      EXPECT_DOUBLE_EQ(be->softmax_xent(be->from_host(hz), labels.data(), cs.smoothing, cs.scale,
                                        nullptr, mx).loss,
                       r.loss);
      Tensor dq;
      be->softmax_xent_queue(be->from_host(host_plain({cs.n, cs.m}, 713)), labels.data(), 0.f, 1.f,
                             nullptr, mx);
      be->softmax_xent_queue(be->from_host(hz), labels.data(), cs.smoothing, cs.scale, &dq, mx);
      const LossResult q = be->queued_loss();
      EXPECT_NEAR(q.loss, rr.loss, 1e-9 * std::fabs(rr.loss));
      EXPECT_EQ(q.top1, rr.top1);
      EXPECT_EQ(q.top5, rr.top5);
      EXPECT_LE(err(dq, dr), 1e-6);
    }
  }
}

// A row whose logits are NaN (a forward that overflowed at 16 bits) ranks its label last:
// it counts as wrong in top-1 and top-5, where a plain > comparison counted it right.
TEST_P(BackendOps, NonFiniteLogitsCountAsWrongPredictions) {
  const int64_t n = 4, m = 10;
  Tensor hz = host_plain({n, m}, 720);
  float* z = hz.data<float>();
  const std::vector<int32_t> labels = {3, 0, 9, 5};
  for (int64_t j = 0; j < m; ++j) z[j] = kNaN;           // row 0: all NaN
  z[1 * m + 0] = kNaN;                                   // row 1: the label's logit NaN
  z[2 * m + 9] = 100.f;                                  // row 2: right, by far
  z[2 * m + 4] = kInf;                                   //   ... but inf elsewhere beats it
  z[3 * m + 5] = 100.f;                                  // row 3: right
  const LossResult r = be->softmax_xent(be->from_host(hz), labels.data(), 0.f, 1.f, nullptr);
  EXPECT_EQ(r.top1, 1) << "only row 3 is right";
  EXPECT_EQ(r.top5, 2) << "rows 2 and 3 are within the top five";
  EXPECT_TRUE(std::isnan(r.loss));
}

TEST_P(BackendOps, SgdPerSegmentAndSkippedOnAQueuedOverflow) {
  int64_t n = 3 * 8192 + 77;  // several chunks, a ragged tail
  std::vector<SgdSegment> segs = {{0, 1000, 1e-4f}, {1000, 20000, 0.f}, {21000, n - 21000, 5e-4f}};
  for (bool nesterov : {false, true}) {
    Tensor hp = host_plain({n}, 801), hg = host_plain({n}, 802), hm = host_plain({n}, 803, 0.1f);
    Tensor p = be->from_host(hp), g = be->from_host(hg), m = be->from_host(hm);
    Tensor pr = ref->from_host(hp), gr = ref->from_host(hg), mr = ref->from_host(hm);
    SgdHyper h{0.05f, 0.9f, nesterov, 0.5f};
    for (int step = 0; step < 3; ++step) {
      be->sgd_step(p, g, m, segs, h);
      ref->sgd_step(pr, gr, mr, segs, h);
    }
    EXPECT_LE(err(p, pr), 1e-6);
    EXPECT_LE(err(m, mr), 1e-6);
    // skip_on_overflow: the verdict of the last unscale_check_queue decides, on the device.
    const std::vector<float> before = values(*be, p);
    Tensor bad = be->from_host(host_plain({n}, 804));
    be->fill(bad, kInf);
    be->unscale_check_queue(bad, 1.f);
    SgdHyper skip = h;
    skip.skip_on_overflow = true;
    be->sgd_step(p, g, m, segs, skip);
    EXPECT_TRUE(be->queued_overflow());
    EXPECT_EQ(values(*be, p), before) << "an update after an overflow verdict was not skipped";
    Tensor fine = be->from_host(host_plain({n}, 805));
    be->unscale_check_queue(fine, 1.f);
    be->sgd_step(p, g, m, segs, skip);
    ref->sgd_step(pr, gr, mr, segs, h);
    EXPECT_FALSE(be->queued_overflow());
    EXPECT_LE(err(p, pr), 1e-6) << "an update after a finite verdict was skipped";
  }
}

TEST_P(BackendOps, UnscaleAndCheckAtOnceAndQueued) {
  int64_t n = 100003;
  Tensor h = host_plain({n}, 901);
  Tensor t = be->from_host(h);
  EXPECT_FALSE(be->unscale_and_check(t, 0.25f));
  auto v = values(*be, t);
  for (int64_t i = 0; i < n; i += 997) EXPECT_EQ(v[size_t(i)], h.data<float>()[i] * 0.25f);
  for (float bad : {kInf, -kInf, kNaN}) {
    for (int64_t at : {int64_t(0), n / 2, n - 1}) {
      Tensor hb = host_plain({n}, 902);
      hb.data<float>()[at] = bad;
      Tensor tb = be->from_host(hb);
      EXPECT_TRUE(be->unscale_and_check(tb, 1.f)) << at;
    }
  }
  Tensor big = be->from_host(host_plain({n}, 903, 1e30f));
  EXPECT_TRUE(be->unscale_and_check(big, 1e10f)) << "overflow of the product itself";
  EXPECT_FALSE(be->unscale_and_check(t, 1.f)) << "no stale verdict";
  // Queued: the same scaling and verdict, read with queued_overflow; a later queue replaces it.
  Tensor q = be->from_host(h);
  be->unscale_check_queue(q, 0.5f);
  EXPECT_FALSE(be->queued_overflow());
  auto vq = values(*be, q);
  for (int64_t i = 0; i < n; i += 991) EXPECT_EQ(vq[size_t(i)], h.data<float>()[i] * 0.5f);
  Tensor hb = host_plain({n}, 905);
  hb.data<float>()[n / 3] = kNaN;
  Tensor tb = be->from_host(hb);
  be->unscale_check_queue(tb, 1.f);
  EXPECT_TRUE(be->queued_overflow());
  be->unscale_check_queue(q, 1.f);
  EXPECT_FALSE(be->queued_overflow()) << "no stale verdict";
}

// The weights' moving average: dst += w * (src - dst).
TEST_P(BackendOps, LerpMatchesTheReference) {
  const int64_t n = 3 * 8192 + 5;
  Tensor hd = host_plain({n}, 906), hs = host_plain({n}, 907);
  Tensor d = be->from_host(hd), s = be->from_host(hs), dr = ref->from_host(hd), sr = ref->from_host(hs);
  for (float w : {0.5f, 2e-4f, 1.f}) {
    be->lerp(d, s, w);
    ref->lerp(dr, sr, w);
    EXPECT_LE(err(d, dr), 1e-6);
  }
}

// ---- data movement ---------------------------------------------------------------------------

// Uploads keep every value (rounded to the compute dtype), whichever layout the backend
// chose; zeros, fill and copy write every element; host copies into an existing buffer (at
// once, and queued into the backend's staging memory, waited for) equal to_host.
TEST_P(BackendOps, UploadsCopiesAndFillsKeepEveryValue) {
  const Shape s{2, 5, 7, 3};
  Tensor h = host_nhwc(s, 910);
  const std::vector<float> want = values(*ref, act_ref(h));
  EXPECT_EQ(nerr(values(*be, be->upload_images(h, dt)), want), 0.0);
  EXPECT_EQ(nerr(values(*be, be->upload_activation(h, dt)), want), 0.0);
  // 8-bit pixels, normalized on the way: each value as fma(pixel, scale, shift) of its channel
  // gives it on the host, rounded to the compute dtype; every byte value, in every channel.
  for (int64_t c : {3, 1}) {
    const Shape ps{2, c, 16, 8};  // 256 pixels
    Tensor hu = Tensor::host(ps, DType::u8, Layout::nhwc), hf = Tensor::host(ps, DType::f32, Layout::nhwc);
    PixelNorm norm;
    for (int k = 0; k < 3; ++k) {
      norm.mean[k] = 0.4f + 0.03f * float(k);
      norm.std[k] = 0.22f + 0.01f * float(k);
    }
    uint8_t* pu = static_cast<uint8_t*>(hu.write_raw());
    for (int64_t i = 0; i < hu.numel(); ++i) {
      pu[i] = uint8_t((i / c * 7) % 256);  // pixel p: 7p mod 256, every value once
      hf.data<float>()[i] = std::fma(float(pu[i]), norm.scale(int(i % c)), norm.shift(int(i % c)));
    }
    EXPECT_EQ(nerr(values(*be, be->upload_pixels(hu, norm, dt)), values(*ref, act_ref(hf))), 0.0) << c;
  }
  EXPECT_THROW(be->upload_pixels(h, PixelNorm{}, dt), Error);  // fp32 is not 8-bit pixels
  const int64_t n = 1 << 18;
  Tensor hp = host_plain({n}, 911);
  Tensor src = be->from_host(hp);
  EXPECT_EQ(values(*be, src), values(*ref, ref->from_host(hp)));
  Tensor z = be->zeros({n});
  EXPECT_EQ(values(*be, z), std::vector<float>(size_t(n), 0.f));
  be->fill(z, 2.5f);
  EXPECT_EQ(values(*be, z), std::vector<float>(size_t(n), 2.5f));
  be->copy(src, z);
  EXPECT_EQ(values(*be, z), values(*be, src));
  const std::vector<float> vals = values(*be, src);
  Tensor pageable = Tensor::host({n});
  std::fill(pageable.data<float>(), pageable.data<float>() + n, kNaN);
  be->copy_to_host(src, pageable);
  EXPECT_EQ(std::memcmp(pageable.raw(), vals.data(), size_t(n) * 4), 0);
  Tensor staged({n}, DType::f32, be->host_staging_allocator());
  std::fill(staged.data<float>(), staged.data<float>() + n, kNaN);
  std::function<void()> wait = be->copy_to_host_async(src, staged);
  be->fill(src, 7.f);  // queued after the copy: the copy holds the values before it
  wait();
  EXPECT_EQ(std::memcmp(staged.raw(), vals.data(), size_t(n) * 4), 0);
}

// kernel_choices: after a convolution and a batch norm ran, a GPU names per shape what cuDNN
// settled on (a plain convolution names no fusion graph: none was planned for it); the CPU
// has no choice to report.
TEST_P(BackendOps, KernelChoicesNameWhatEachShapeRan) {
  EXPECT_TRUE(be->kernel_choices().empty()) << "nothing has run yet";
  Tensor x = act(host_nhwc({2, 8, 6, 6}, 301));
  Tensor w = be->from_host(host_plain({16, 8, 3, 3}, 302, 0.1f));
  Tensor y = be->conv2d_forward(x, w, ConvParams{3, 3, 1, 1});
  BnParams pb = bn_params(*be, host_plain({16}, 303, 0.2f, 1.f), host_plain({16}, 304, 0.5f));
  BnSaved sb;
  be->batchnorm_forward_train(y, pb.gamma, pb.beta, 1e-5f, /*relu=*/true, sb);
  if (!on_gpu()) {
    EXPECT_TRUE(be->kernel_choices().empty());
    return;
  }
  std::vector<std::string> conv, bn;  // (an fp32 fallback adds the fp32 shape's lines)
  for (const std::string& l : be->kernel_choices())
    (l.rfind("conv ", 0) == 0 ? conv : bn).push_back(l);
  ASSERT_FALSE(conv.empty());
  ASSERT_FALSE(bn.empty());
  for (const std::string& l : bn) EXPECT_EQ(l.rfind("batchnorm ", 0), 0u) << l;
  bool relu_ran = false;
  for (const std::string& l : bn) relu_ran |= l.find("with relu unused") == std::string::npos;
  EXPECT_TRUE(relu_ran) << "a ReLU batch norm ran: " << bn[0];
  const std::string& c = conv[0];
  EXPECT_NE(c.find("forward algo"), std::string::npos) << c;
  EXPECT_NE(c.find("data unused"), std::string::npos) << "no backward ran: " << c;
  EXPECT_EQ(c.find(" graph: "), std::string::npos) << "no fusion graph was planned: " << c;
}

INSTANTIATE_TEST_SUITE_P(Cpu, BackendOps, ::testing::ValuesIn(kCpuTargets), target_name);
INSTANTIATE_TEST_SUITE_P(Cuda, BackendOps, ::testing::ValuesIn(kCudaTargets), target_name);

// ---- the suite's own footing ------------------------------------------------------------------

// The reference refuses operands in two layouts: an activation fed to it in the wrong layout
// (an upload_images tensor where a layer in the middle of a network takes its input) ends the
// test with an error instead of comparing against a wrong reference.
TEST(BackendOpsReference, RefusesAnActivationInTheWrongLayout) {
  auto ref = make_backend("cpu", BackendOptions{});
  const Shape s{4, 32, 14, 14};
  Tensor h = host_nhwc(s, 930);
  Tensor x = ref->upload_activation(h, DType::f32);
  Tensor w = ref->from_host(host_plain({32, 32, 1, 1}, 931, 0.2f));
  Tensor acc_as_image = ref->upload_images(h, DType::f32);
  ASSERT_NE(acc_as_image.layout(), x.layout()) << "the CPU's layers take another layout than images";
  try {
    ref->conv2d_backward_data_add(ref->conv2d_forward(x, w, ConvParams{1, 1, 1, 0}), w, x,
                                  ConvParams{1, 1, 1, 0}, acc_as_image);
    FAIL() << "mixed layouts were added";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("operands differ"), std::string::npos) << e.what();
  }
}

// The composed residual tail's backward (BN + Add + ReLU, as the CPU runs it) lets the saved
// output go once it has given the ReLU's mask, before the batch norm's gradient is made: at
// the peak of a checkpointed stage's backward it was one activation more alive (stage
// checkpointing of ResNet-50 b64 fp32 kept 0.52 of the activation memory of none, not 0.49).
TEST(BackendOpsMemory, TheComposedResidualTailsBackwardFreesItsOutputFirst) {
  auto be = make_backend("cpu", BackendOptions{});
  const Shape s{8, 64, 28, 28};
  Tensor x = be->upload_activation(host_nhwc(s, 950), DType::f32);
  Tensor z = be->upload_activation(host_nhwc(s, 951), DType::f32);
  Tensor dy = be->upload_activation(host_nhwc(s, 952), DType::f32);
  BnParams p = bn_params(*be, host_plain({64}, 953, 0.2f, 1.f), host_plain({64}, 954));
  BnSaved saved;
  be->batchnorm_add_relu_forward_train(x, z, p.gamma, p.beta, 1e-5f, saved);  // output dropped:
  z = Tensor();                                                               // saved holds it
  const size_t one = x.nbytes();
  Allocator& host = Allocator::host();
  const size_t before = host.stats().current_bytes;
  host.reset_peak();
  Tensor dz;
  Tensor dx = be->batchnorm_add_relu_backward(dy, x, p.gamma, p.beta, saved, 1e-5f, p.dgamma, p.dbeta, dz);
  const size_t grew = host.stats().peak_bytes - before;
  // dz and dx are new; the saved output went before dx came: at most one activation more.
  EXPECT_LT(grew, one + one / 2) << "the peak grew by " << double(grew) / double(one) << " activations";
  EXPECT_TRUE(dz.defined() && dx.defined());
}

// A backend whose fallback calls the public op it implements (as the CUDA backend's fused
// BN + Add + ReLU once did when cuDNN refused a shape): the op nests into itself, and ends in
// an error naming the op, not in a stack overflow.
class FallbackThroughThePublicOp : public cpu::CpuBackend {
 public:
  using cpu::CpuBackend::CpuBackend;

 protected:
  Tensor batchnorm_add_relu_forward_train_impl(const Tensor& x, const Tensor& z,
                                               const Tensor& gamma, const Tensor& beta,
                                               float eps, BnSaved& saved) override {
    return batchnorm_add_relu_forward_train(x, z, gamma, beta, eps, saved);  // the mistake
  }
  Tensor batchnorm_add_relu_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                          const Tensor& beta, BnSaved& saved, float eps,
                                          Tensor& dgamma, Tensor& dbeta, Tensor& dz) override {
    return composed_batchnorm_add_relu_backward(dy, x, gamma, beta, saved, eps, dgamma, dbeta, dz);
  }
};

TEST(BackendOpsGuard, AFallbackThatCallsItsOwnPublicOpEndsInAnError) {
  FallbackThroughThePublicOp be{BackendOptions{}};
  const Shape s{2, 6, 3, 3};
  Tensor x = be.upload_activation(host_nhwc(s, 940), DType::f32);
  Tensor z = be.upload_activation(host_nhwc(s, 941), DType::f32);
  BnParams p = bn_params(be, host_plain({6}, 942, 0.2f, 1.f), host_plain({6}, 943));
  BnSaved saved;
  try {
    be.batchnorm_add_relu_forward_train(x, z, p.gamma, p.beta, 1e-5f, saved);
    FAIL() << "the recursion returned";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("nested"), std::string::npos) << m;
    EXPECT_NE(m.find("batchnorm_add_relu_forward"), std::string::npos) << m;
  }
  // Unwinding restored the count: ops run again, the backward's fallback (the composed form,
  // as it should be) included.
  BnSaved s2;
  be.batchnorm_forward_train(x, p.gamma, p.beta, 1e-5f, false, s2);
  Tensor dz;
  Tensor dy = be.upload_activation(host_nhwc(s, 944), DType::f32);
  s2.backend_state[BnSaved::kComposedOutput] = be.relu_forward(x);
  EXPECT_NO_THROW(be.batchnorm_add_relu_backward(dy, x, p.gamma, p.beta, s2, 1e-5f, p.dgamma, p.dbeta, dz));
  EXPECT_TRUE(dz.defined());
}

}  // namespace
