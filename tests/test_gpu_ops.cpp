// The CUDA backend against the CPU backend: every op of kernels/ops.h on fresh random inputs
// in fp32, tf32, bf16 and fp16 (normalized error within a per-dtype tolerance), odd shapes
// and batch 1, with every GPU output poisoned (NaN bytes) before it is written; then 20
// training steps of ResNet-20 on 28x28x1 images CPU vs GPU, fp16 overflow injection on the
// GPU, and the caching allocator's steady state. Each GPU test skips without a CUDA device.
#include <gtest/gtest.h>
#ifdef SPOTRAIN_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/cublas_lazy.h"
#endif

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/loss_scaler.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "core/philox.h"
#include "engine/step.h"
#include "kernels/elementwise.h"
#include "kernels/ops.h"
#include "kernels/step_capture.h"
#include "layers/resnet.h"
#include "step_reference.h"

using namespace spotrain;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

bool have_gpu() {
  static const bool yes = cuda_backend_ready();
  return yes;
}

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

struct Prec {
  const char* name;
  DType dt;
  bool tf32;
  double tol;  // normalized error allowed for GEMM-like ops (conv, linear, BN)
};
const Prec kPrecs[] = {
    {"fp32", DType::f32, false, 1e-4},
    {"tf32", DType::f32, true, 5e-3},
    {"bf16", DType::bf16, false, 3e-2},
    {"fp16", DType::f16, false, 5e-3},
};
std::string prec_name(const ::testing::TestParamInfo<Prec>& i) { return i.param.name; }
// How gtest (and so the CTest test list) prints a parameter: its name, not its bytes.
void PrintTo(const Prec& p, std::ostream* os) { *os << p.name; }
Precision precision_of(const Prec& p) {
  return p.dt == DType::f16    ? Precision::fp16
         : p.dt == DType::bf16 ? Precision::bf16
         : p.tf32              ? Precision::tf32
                               : Precision::fp32;
}

std::unique_ptr<Backend> cpu() {
  BackendOptions o;
  o.threads = 2;
  return make_backend("cpu", o);
}

std::unique_ptr<Backend> gpu(bool tf32 = false, bool deterministic = false) {
  BackendOptions o;
  o.tf32 = tf32;
  o.deterministic = deterministic;
  o.poison = true;
  return make_backend("cuda", o);
}

std::vector<float> normals(int64_t n, uint64_t seed, float scale = 1.f, float shift = 0.f) {
  Philox rng(seed, 77);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = rng.normal() * scale + shift;
  return v;
}

// Host fp32 tensors: 4-D ones NHWC (the logical order (N, C, H, W) filled from `v` in memory
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

#define EXPECT_CLOSE(be_gpu, tg, be_cpu, tc, tol) \
  EXPECT_LE(nerr(values(be_gpu, tg), values(be_cpu, tc)), (tol)) << #tg

// Storage-dtype rounding: the tolerance of elementwise results in dt.
double elem_tol(DType dt) { return dt == DType::bf16 ? 8e-3 : dt == DType::f16 ? 1e-3 : 1e-6; }

class GpuOps : public ::testing::TestWithParam<Prec> {};

// ---- convolution -----------------------------------------------------------------------

struct ConvCase {
  Shape x;  // (N, C, H, W)
  int out, k, stride, pad;
};

TEST_P(GpuOps, ConvolutionForwardBackwardDataAndWeights) {
  REQUIRE_GPU();
  Prec pr = GetParam();
  auto c = cpu();
  auto g = gpu(pr.tf32);
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
    Tensor xc = c->upload_images(hx, pr.dt), xg = g->upload_images(hx, pr.dt);
    Tensor wc = c->from_host(hw), wg = g->from_host(hw);
    // New weight tensors: their storage versions are new, so no cached copy is reused.
    Tensor yc = c->conv2d_forward(xc, wc, p), yg = g->conv2d_forward(xg, wg, p);
    ASSERT_EQ(yg.shape(), yc.shape());
    EXPECT_EQ(yg.dtype(), pr.dt);
    EXPECT_CLOSE(*g, yg, *c, yc, pr.tol);
    Tensor hdy = host_nhwc(yc.shape(), ++seed);
    Tensor dyc = c->upload_images(hdy, pr.dt), dyg = g->upload_images(hdy, pr.dt);
    Tensor dxc = c->conv2d_backward_data(dyc, wc, xc, p),
           dxg = g->conv2d_backward_data(dyg, wg, xg, p);
    EXPECT_EQ(dxg.shape(), xg.shape());
    EXPECT_CLOSE(*g, dxg, *c, dxc, pr.tol);
    Tensor dwc = c->zeros(ws), dwg = g->zeros(ws);
    g->fill(dwg, kNaN);
    c->conv2d_backward_weights(xc, dyc, p, dwc);
    g->conv2d_backward_weights(xg, dyg, p, dwg);
    EXPECT_CLOSE(*g, dwg, *c, dwc, pr.tol);
    // Twice with the same weights (cached copy), and after a copy into them (the copy marks
    // them written: the cached copy is refreshed).
    EXPECT_CLOSE(*g, g->conv2d_forward(xg, wg, p), *c, yc, pr.tol);
    Tensor hw2 = host_plain(ws, ++seed);
    g->copy(g->from_host(hw2), wg);
    c->copy(c->from_host(hw2), wc);
    EXPECT_CLOSE(*g, g->conv2d_forward(xg, wg, p), *c, c->conv2d_forward(xc, wc, p), pr.tol);
  }
}

// ---- batch norm ------------------------------------------------------------------------------

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

// One backend's arguments of conv2d_backward_bn_relu: the convolution's filter, its input x
// (the batch norm's input), the batch norm it applies with its statistics, and its parameters
// (whose dgamma and dbeta take the gradients).
struct FusedBackwardArgs {
  const Tensor &w, &x;
  const BnApply& pro;
  const BnSaved& saved;
  BnParams& bn;
};

// conv2d_backward_bn_relu on the CPU and the GPU from the output gradient `hdy`, the GPU's
// outputs poisoned first: x's gradient, dw, dgamma and dbeta against the CPU's.
void expect_fused_backward_close(Backend* c, Backend* g, const FusedBackwardArgs& ca,
                                 const FusedBackwardArgs& ga, const Tensor& hdy, DType dt,
                                 const ConvParams& p, double tol) {
  Tensor dyc = c->upload_images(hdy, dt), dyg = g->upload_images(hdy, dt);
  Tensor dwc = c->zeros(ca.w.shape()), dwg = g->zeros(ga.w.shape());
  g->fill(dwg, kNaN);
  g->fill(ga.bn.dgamma, kNaN);
  g->fill(ga.bn.dbeta, kNaN);
  Tensor dxc = c->conv2d_backward_bn_relu(dyc, ca.w, ca.x, p, ca.pro, ca.saved, dwc, ca.bn.dgamma, ca.bn.dbeta);
  Tensor dxg = g->conv2d_backward_bn_relu(dyg, ga.w, ga.x, p, ga.pro, ga.saved, dwg, ga.bn.dgamma, ga.bn.dbeta);
  EXPECT_CLOSE(*g, dxg, *c, dxc, 4 * tol);
  EXPECT_CLOSE(*g, dwg, *c, dwc, 2 * tol);
  EXPECT_CLOSE(*g, ga.bn.dgamma, *c, ca.bn.dgamma, 4 * tol);
  EXPECT_CLOSE(*g, ga.bn.dbeta, *c, ca.bn.dbeta, 4 * tol);
}

// kernel_choices: after a convolution and a batch norm ran, one line per shape names what
// cuDNN settled on; a plain convolution names no fusion graph (none was planned for it).
TEST_P(GpuOps, KernelChoicesNameWhatEachShapeRan) {
  REQUIRE_GPU();
  Prec pr = GetParam();
  auto g = gpu(pr.tf32);
  EXPECT_TRUE(g->kernel_choices().empty()) << "nothing has run yet";
  Tensor hx = host_nhwc({2, 8, 6, 6}, 301);
  Tensor xg = g->upload_images(hx, pr.dt);
  Tensor wg = g->from_host(host_plain({16, 8, 3, 3}, 302, 0.1f));
  Tensor yg = g->conv2d_forward(xg, wg, ConvParams{3, 3, 1, 1});
  BnParams pg = bn_params(*g, host_plain({16}, 303, 0.2f, 1.f), host_plain({16}, 304, 0.5f));
  BnSaved sg;
  g->batchnorm_forward_train(yg, pg.gamma, pg.beta, 1e-5f, /*relu=*/true, sg);
  std::vector<std::string> conv, bn;  // (an fp32 fallback adds the fp32 shape's lines)
  for (const std::string& l : g->kernel_choices())
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

TEST_P(GpuOps, BatchNormTrainBackwardRunningAndInference) {
  REQUIRE_GPU();
  Prec pr = GetParam();
  auto c = cpu();
  auto g = gpu(pr.tf32);
  const Shape shapes[] = {{1, 3, 5, 7}, {4, 16, 6, 6}, {2, 64, 3, 3}, {8, 5, 1, 1}};
  uint64_t seed = 200;
  double tol = std::max(pr.tol, 10 * elem_tol(pr.dt));
  for (const Shape& s : shapes) {
    for (bool relu : {false, true}) {
      SCOPED_TRACE(shape_str(s) + (relu ? " relu" : ""));
      int64_t C = s[1];
      Tensor hx = host_nhwc(s, ++seed, 2.f);
      Tensor hg = host_plain({C}, ++seed, 0.2f, 1.f), hb = host_plain({C}, ++seed, 0.5f);
      Tensor xc = c->upload_images(hx, pr.dt), xg = g->upload_images(hx, pr.dt);
      BnParams pc = bn_params(*c, hg, hb), pg = bn_params(*g, hg, hb);
      Tensor &gc = pc.gamma, &bc = pc.beta, &gg = pg.gamma, &bg = pg.beta;
      BnSaved sc, sg;
      Tensor yc = c->batchnorm_forward_train(xc, gc, bc, 1e-5f, relu, sc);
      Tensor yg = g->batchnorm_forward_train(xg, gg, bg, 1e-5f, relu, sg);
      EXPECT_CLOSE(*g, yg, *c, yc, tol);
      EXPECT_CLOSE(*g, sg.mean, *c, sc.mean, tol);
      EXPECT_CLOSE(*g, sg.var, *c, sc.var, tol);
      Tensor hdy = host_nhwc(s, ++seed);
      Tensor dyc = c->upload_images(hdy, pr.dt), dyg = g->upload_images(hdy, pr.dt);
      Tensor &dgc = pc.dgamma, &dbc = pc.dbeta, &dgg = pg.dgamma, &dbg = pg.dbeta;
      g->fill(dgg, kNaN);
      g->fill(dbg, kNaN);
      Tensor dxc = c->batchnorm_backward(dyc, xc, gc, bc, sc, 1e-5f, relu, dgc, dbc);
      Tensor dxg = g->batchnorm_backward(dyg, xg, gg, bg, sg, 1e-5f, relu, dgg, dbg);
      EXPECT_CLOSE(*g, dxg, *c, dxc, 2 * tol);
      EXPECT_CLOSE(*g, dgg, *c, dgc, 2 * tol);
      EXPECT_CLOSE(*g, dbg, *c, dbc, 2 * tol);
      // Running statistics, then inference with them.
      Tensor hrm = host_plain({C}, ++seed, 0.1f), hrv = host_plain({C}, ++seed, 0.1f, 1.f);
      Tensor rmc = c->from_host(hrm), rvc = c->from_host(hrv);
      Tensor rmg = g->from_host(hrm), rvg = g->from_host(hrv);
      int64_t n = s[0] * s[2] * s[3];
      c->batchnorm_update_running(rmc, rvc, sc, 0.1f, n);
      g->batchnorm_update_running(rmg, rvg, sg, 0.1f, n);
      EXPECT_CLOSE(*g, rmg, *c, rmc, tol);
      EXPECT_CLOSE(*g, rvg, *c, rvc, tol);
      Tensor ic = c->batchnorm_forward_infer(xc, gc, bc, rmc, rvc, 1e-5f, relu);
      Tensor ig = g->batchnorm_forward_infer(xg, gg, bg, rmg, rvg, 1e-5f, relu);
      EXPECT_CLOSE(*g, ig, *c, ic, tol);
    }
  }
}

// Conv + batch-norm fusion (--fusion bn): the convolution with the statistics of its output,
// without and then with the previous batch norm and ReLU applied as it reads, and the backward
// through both at once, against the CPU's composition; the batch-norm backward and the running
// statistics run from those statistics (no cuDNN forward of that shape chose a configuration). At 16 bits the GPU runs
// cuDNN's graph where it takes the shape (kernel_choices says "ran"), else the composition.
TEST_P(GpuOps, ConvolutionWithBatchNormStatisticsAndPrologue) {
  REQUIRE_GPU();
  Prec pr = GetParam();
  auto c = cpu();
  auto g = gpu(pr.tf32);
  const Shape xs{4, 32, 10, 10};
  const int64_t K = 64;
  const float eps = 1e-5f;
  const ConvParams p3{3, 3, 1, 1}, p1{1, 1, 1, 0};
  Tensor hx = host_nhwc(xs, 340);
  Tensor hw1 = host_plain({K, xs[1], 3, 3}, 341, 1.f / std::sqrt(float(xs[1] * 9)));
  Tensor hw2 = host_plain({K, K, 1, 1}, 342, 1.f / std::sqrt(float(K)));
  Tensor xc = c->upload_images(hx, pr.dt), xg = g->upload_images(hx, pr.dt);
  Tensor w1c = c->from_host(hw1), w1g = g->from_host(hw1);
  Tensor w2c = c->from_host(hw2), w2g = g->from_host(hw2);
  // conv1 with bn1's statistics
  BnSaved sc, sg;
  Tensor y1c = c->conv2d_forward_bn_stats(xc, w1c, p3, nullptr, eps, &sc);
  Tensor y1g = g->conv2d_forward_bn_stats(xg, w1g, p3, nullptr, eps, &sg);
  double tol = std::max(pr.tol, 10 * elem_tol(pr.dt));
  EXPECT_CLOSE(*g, y1g, *c, y1c, tol);
  EXPECT_CLOSE(*g, sg.mean, *c, sc.mean, tol);
  EXPECT_CLOSE(*g, sg.var, *c, sc.var, tol);
  // conv2 applying bn1 and its ReLU as it reads y1, with the statistics of its own output
  BnParams pc = bn_params(*c, host_plain({K}, 343, 0.2f, 1.f), host_plain({K}, 344, 0.5f));
  BnParams pg = bn_params(*g, host_plain({K}, 343, 0.2f, 1.f), host_plain({K}, 344, 0.5f));
  BnApply ac{pc.gamma, pc.beta, sc.mean, sc.var, eps}, ag{pg.gamma, pg.beta, sg.mean, sg.var, eps};
  BnSaved s2c, s2g;
  Tensor y2c = c->conv2d_forward_bn_stats(y1c, w2c, p1, &ac, eps, &s2c);
  Tensor y2g = g->conv2d_forward_bn_stats(y1g, w2g, p1, &ag, eps, &s2g);
  EXPECT_CLOSE(*g, y2g, *c, y2c, 2 * tol);
  EXPECT_CLOSE(*g, s2g.mean, *c, s2c.mean, 2 * tol);
  EXPECT_CLOSE(*g, s2g.var, *c, s2c.var, 2 * tol);
  // the same without the statistics (a block's last convolution)
  EXPECT_CLOSE(*g, g->conv2d_forward_bn_stats(y1g, w2g, p1, &ag, eps, nullptr), *c, y2c, 2 * tol);
  // Backward through conv2 and bn1 + ReLU at once, from the statistics conv1 made
  BnParams qc = bn_params(*c, host_plain({K}, 343, 0.2f, 1.f), host_plain({K}, 344, 0.5f));
  BnParams qg = bn_params(*g, host_plain({K}, 343, 0.2f, 1.f), host_plain({K}, 344, 0.5f));
  expect_fused_backward_close(c.get(), g.get(), {w2c, y1c, ac, sc, qc}, {w2g, y1g, ag, sg, qg},
                              host_nhwc(y2c.shape(), 346), pr.dt, p1, tol);
  // bn1's backward from the statistics conv1 made, and its running statistics
  Tensor hdy = host_nhwc(y1c.shape(), 345);
  Tensor dyc = c->upload_images(hdy, pr.dt), dyg = g->upload_images(hdy, pr.dt);
  g->fill(pg.dgamma, kNaN);
  g->fill(pg.dbeta, kNaN);
  Tensor dxc = c->batchnorm_backward(dyc, y1c, pc.gamma, pc.beta, sc, eps, false, pc.dgamma, pc.dbeta);
  Tensor dxg = g->batchnorm_backward(dyg, y1g, pg.gamma, pg.beta, sg, eps, false, pg.dgamma, pg.dbeta);
  EXPECT_CLOSE(*g, dxg, *c, dxc, 2 * tol);
  EXPECT_CLOSE(*g, pg.dgamma, *c, pc.dgamma, 2 * tol);
  EXPECT_CLOSE(*g, pg.dbeta, *c, pc.dbeta, 2 * tol);
  Tensor rmc = c->zeros({K}), rvc = c->zeros({K}), rmg = g->zeros({K}), rvg = g->zeros({K});
  c->batchnorm_update_running(rmc, rvc, sc, 0.1f, xs[0] * xs[2] * xs[3]);
  g->batchnorm_update_running(rmg, rvg, sg, 0.1f, xs[0] * xs[2] * xs[3]);
  EXPECT_CLOSE(*g, rmg, *c, rmc, tol);
  EXPECT_CLOSE(*g, rvg, *c, rvc, tol);
  // What ran, per shape (printed: which graphs this GPU and cuDNN take is what the test is
  // for on a new one): conv1's statistics graph and conv2's prologue graph and backward graphs
  // ran where cuDNN accepted them; fp32 has none.
  auto verdict = [&](const char* input, const char* graph) {
    for (const std::string& l : g->kernel_choices()) {
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
    if (pr.dt == DType::f32) {
      EXPECT_EQ(v, "none") << input;
    } else {
      const bool accepted = v.find("graph: accepted") != std::string::npos;
      EXPECT_EQ(v.find(", ran") != std::string::npos, accepted) << v;
      EXPECT_TRUE(accepted || v.find("graph: refused") != std::string::npos) << v;
    }
  }
}

// The prologue's graphs where padding and stride matter (a block's 3x3 convolution, stride 1
// and 2): the padded border must read zeros, not relu(bias), in the forward, the weight
// gradient and the data gradient. Against the CPU's composition, with a nonzero bn shift.
TEST_P(GpuOps, FusedPrologueHoldsAtPaddedAndStridedConvolutions) {
  REQUIRE_GPU();
  Prec pr = GetParam();
  auto c = cpu();
  auto g = gpu(pr.tf32);
  const Shape xs{4, 32, 9, 9};
  const float eps = 1e-5f;
  const double tol = std::max(pr.tol, 10 * elem_tol(pr.dt));
  uint64_t seed = 900;
  for (int stride : {1, 2}) {
    SCOPED_TRACE("3x3 stride " + std::to_string(stride));
    const ConvParams p{3, 3, stride, 1};
    const int64_t C = xs[1], K = 48;
    // x plays the batch norm's input, its batch statistics made by each backend's own
    // batch-norm forward; beta well above zero, so relu(bias) at the border would show
    Tensor hx = host_nhwc(xs, ++seed);
    Tensor xc = c->upload_images(hx, pr.dt), xg = g->upload_images(hx, pr.dt);
    Tensor hgamma = host_plain({C}, ++seed, 0.2f, 1.f), hbeta = host_plain({C}, ++seed, 0.3f, 0.8f);
    BnParams pc = bn_params(*c, hgamma, hbeta), pg = bn_params(*g, hgamma, hbeta);
    BnSaved sc, sg;
    c->batchnorm_forward_train(xc, pc.gamma, pc.beta, eps, false, sc);
    g->batchnorm_forward_train(xg, pg.gamma, pg.beta, eps, false, sg);
    BnApply ac{pc.gamma, pc.beta, sc.mean, sc.var, eps}, ag{pg.gamma, pg.beta, sg.mean, sg.var, eps};
    Tensor hw = host_plain({K, C, 3, 3}, ++seed, 1.f / std::sqrt(float(C * 9)));
    Tensor wc = c->from_host(hw), wg = g->from_host(hw);
    BnSaved s2c, s2g;
    Tensor yc = c->conv2d_forward_bn_stats(xc, wc, p, &ac, eps, &s2c);
    Tensor yg = g->conv2d_forward_bn_stats(xg, wg, p, &ag, eps, &s2g);
    EXPECT_CLOSE(*g, yg, *c, yc, 2 * tol);
    EXPECT_CLOSE(*g, s2g.mean, *c, s2c.mean, 2 * tol);
    EXPECT_CLOSE(*g, s2g.var, *c, s2c.var, 2 * tol);
    EXPECT_CLOSE(*g, g->conv2d_forward_bn_stats(xg, wg, p, &ag, eps, nullptr), *c, yc, 2 * tol);
    expect_fused_backward_close(c.get(), g.get(), {wc, xc, ac, sc, pc}, {wg, xg, ag, sg, pg},
                                host_nhwc(yc.shape(), ++seed), pr.dt, p, tol);
  }
  for (const std::string& l : g->kernel_choices())
    if (l.rfind("conv ", 0) == 0) std::printf("  %s\n", l.c_str());
}

// acc += backward-data (cuDNN's beta = 1), first at a shape's first use (the algorithm search
// must not overwrite acc), then again with the algorithm chosen; against the CPU's sum.
TEST_P(GpuOps, ConvolutionBackwardDataAddsIntoTheGivenGradient) {
  REQUIRE_GPU();
  Prec pr = GetParam();
  auto c = cpu();
  auto g = gpu(pr.tf32);
  const ConvCase cases[] = {{{4, 32, 14, 14}, 64, 1, 1, 0}, {{2, 16, 9, 9}, 8, 3, 2, 1}};
  uint64_t seed = 700;
  for (const auto& cc : cases) {
    SCOPED_TRACE(shape_str(cc.x) + " k" + std::to_string(cc.k));
    ConvParams p{cc.k, cc.k, cc.stride, cc.pad};
    Shape ws{cc.out, cc.x[1], cc.k, cc.k};
    Tensor hx = host_nhwc(cc.x, ++seed);
    Tensor hw = host_plain(ws, ++seed, 1.f / std::sqrt(float(cc.x[1] * cc.k * cc.k)));
    Tensor xc = c->upload_images(hx, pr.dt), xg = g->upload_images(hx, pr.dt);
    Tensor wc = c->from_host(hw), wg = g->from_host(hw);
    Tensor yc = c->conv2d_forward(xc, wc, p);
    Tensor hdy = host_nhwc(yc.shape(), ++seed);
    Tensor dyc = c->upload_images(hdy, pr.dt), dyg = g->upload_images(hdy, pr.dt);
    for (int round = 0; round < 2; ++round) {
      Tensor hacc = host_nhwc(cc.x, ++seed);
      Tensor accc = c->upload_images(hacc, pr.dt), accg = g->upload_images(hacc, pr.dt);
      c->conv2d_backward_data_add(dyc, wc, xc, p, accc);
      g->conv2d_backward_data_add(dyg, wg, xg, p, accg);
      EXPECT_EQ(accg.shape(), xg.shape());
      EXPECT_CLOSE(*g, accg, *c, accc, std::max(pr.tol, 2 * elem_tol(pr.dt))) << "round " << round;
    }
  }
}

// relu(bn(x) + z), a residual block's tail: cuDNN's fused BN_ADD_ACTIVATION (or its
// composition, where cuDNN refuses a shape) against the CPU's composition of BN and Add in
// fp32 on the same (rounded) inputs. Not against a composition in fp16/bf16: that rounds
// bn(x) before the add, and outputs near zero then change sign, with them the ReLU mask and
// about 1% of the gradient (measured on an H200); the fused op rounds once, as fp32 does.
TEST_P(GpuOps, BatchNormAddReluMatchesTheComposition) {
  REQUIRE_GPU();
  Prec pr = GetParam();
  auto c = cpu();
  auto g = gpu(pr.tf32);
  const Shape shapes[] = {{8, 64, 14, 14}, {4, 256, 7, 7}, {2, 6, 3, 3}};
  uint64_t seed = 900;
  double tol = std::max(pr.tol, 10 * elem_tol(pr.dt));
  for (const Shape& s : shapes) {
    SCOPED_TRACE(shape_str(s));
    int64_t C = s[1];
    Tensor hx = host_nhwc(s, ++seed, 2.f), hz = host_nhwc(s, ++seed);
    Tensor hg = host_plain({C}, ++seed, 0.2f, 1.f), hb = host_plain({C}, ++seed, 0.5f);
    // The CPU reference takes the GPU's inputs as rounded to its dtype, in fp32.
    auto ref = [&](const Tensor& h) { return c->cast(c->upload_images(h, pr.dt), DType::f32); };
    Tensor xc = ref(hx), xg = g->upload_images(hx, pr.dt);
    Tensor zc = ref(hz), zg = g->upload_images(hz, pr.dt);
    BnParams pc = bn_params(*c, hg, hb), pg = bn_params(*g, hg, hb);
    Tensor &gc = pc.gamma, &bc = pc.beta, &gg = pg.gamma, &bg = pg.beta;
    BnSaved sc, sg;
    Tensor yc = c->batchnorm_add_relu_forward_train(xc, zc, gc, bc, 1e-5f, sc);
    Tensor yg = g->batchnorm_add_relu_forward_train(xg, zg, gg, bg, 1e-5f, sg);
    EXPECT_CLOSE(*g, yg, *c, yc, tol);
    EXPECT_CLOSE(*g, sg.mean, *c, sc.mean, tol);
    EXPECT_CLOSE(*g, sg.var, *c, sc.var, tol);
    Tensor hdy = host_nhwc(s, ++seed);
    Tensor dyc = ref(hdy), dyg = g->upload_images(hdy, pr.dt);
    Tensor &dgc = pc.dgamma, &dbc = pc.dbeta, &dgg = pg.dgamma, &dbg = pg.dbeta;
    g->fill(dgg, kNaN);
    g->fill(dbg, kNaN);
    Tensor dzc, dzg;
    Tensor dxc = c->batchnorm_add_relu_backward(dyc, xc, gc, bc, sc, 1e-5f, dgc, dbc, dzc);
    Tensor dxg = g->batchnorm_add_relu_backward(dyg, xg, gg, bg, sg, 1e-5f, dgg, dbg, dzg);
    EXPECT_CLOSE(*g, dzg, *c, dzc, tol);
    EXPECT_CLOSE(*g, dxg, *c, dxc, 2 * tol);
    EXPECT_CLOSE(*g, dgg, *c, dgc, 2 * tol);
    EXPECT_CLOSE(*g, dbg, *c, dbc, 2 * tol);
  }
}

// ---- pooling -------------------------------------------------------------------------------

TEST_P(GpuOps, MaxPoolAndGlobalAveragePool) {
  REQUIRE_GPU();
  Prec pr = GetParam();
  auto c = cpu();
  auto g = gpu(pr.tf32);
  const Shape shapes[] = {{1, 3, 6, 5}, {2, 8, 9, 9}, {3, 16, 4, 4}, {2, 64, 17, 16}};
  uint64_t seed = 300;
  double tol = elem_tol(pr.dt);
  for (const Shape& s : shapes) {
    SCOPED_TRACE(shape_str(s));
    PoolParams p{3, 2, 1};
    Tensor hx = host_nhwc_distinct(s, ++seed);
    Tensor xc = c->upload_images(hx, pr.dt), xg = g->upload_images(hx, pr.dt);
    Tensor wsc, wsg;
    Tensor yc = c->maxpool_forward(xc, p, wsc), yg = g->maxpool_forward(xg, p, wsg);
    ASSERT_EQ(yg.shape(), yc.shape());
    EXPECT_CLOSE(*g, yg, *c, yc, tol);
    Tensor hdy = host_nhwc(yc.shape(), ++seed);
    Tensor dyc = c->upload_images(hdy, pr.dt), dyg = g->upload_images(hdy, pr.dt);
    EXPECT_CLOSE(*g, g->maxpool_backward(dyg, xg, wsg, p), *c, c->maxpool_backward(dyc, xc, wsc, p),
                 tol);
    Tensor pc = c->global_avgpool_forward(xc), pg = g->global_avgpool_forward(xg);
    EXPECT_EQ(pg.dtype(), DType::f32);
    EXPECT_CLOSE(*g, pg, *c, pc, 1e-5);
    Tensor hd = host_plain({s[0], s[1]}, ++seed);
    Tensor gbc = c->global_avgpool_backward(c->from_host(hd), xc);
    Tensor gbg = g->global_avgpool_backward(g->from_host(hd), xg);
    EXPECT_EQ(gbg.dtype(), pr.dt);
    EXPECT_CLOSE(*g, gbg, *c, gbc, tol);
  }
}

// Ties, as after a ReLU (a window of zeros): each window's gradient goes to exactly one of
// its inputs, so the gradient is conserved: sum(dx) == sum(dy).
TEST_P(GpuOps, MaxPoolRoutesEachWindowsGradientOnceOnTies) {
  REQUIRE_GPU();
  Prec pr = GetParam();
  auto g = gpu(pr.tf32);
  for (const Shape& s : {Shape{2, 16, 9, 9}, Shape{1, 3, 8, 7}}) {
    SCOPED_TRACE(shape_str(s));
    PoolParams p{3, 2, 1};
    Tensor hx = Tensor::host(s, DType::f32, Layout::nhwc);
    std::memset(hx.raw(), 0, hx.nbytes());
    Tensor ws;
    Tensor y = g->maxpool_forward(g->upload_images(hx, pr.dt), p, ws);
    Tensor hdy = Tensor::host(y.shape(), DType::f32, Layout::nhwc);
    for (int64_t i = 0; i < hdy.numel(); ++i) hdy.data<float>()[i] = float(1 + i % 7);  // exact
    Tensor dx = g->maxpool_backward(g->upload_images(hdy, pr.dt), g->upload_images(hx, pr.dt), ws, p);
    double sdx = 0, sdy = 0;
    for (float v : values(*g, dx)) sdx += v;
    for (int64_t i = 0; i < hdy.numel(); ++i) sdy += hdy.data<float>()[i];
    EXPECT_EQ(sdx, sdy);
  }
}

// ---- elementwise ---------------------------------------------------------------------------

TEST_P(GpuOps, ReluAddAndTheirBackward) {
  REQUIRE_GPU();
  Prec pr = GetParam();
  auto c = cpu();
  auto g = gpu(pr.tf32);
  for (const Shape& s : {Shape{1, 3, 5, 7}, Shape{4, 33, 7, 3}}) {
    SCOPED_TRACE(shape_str(s));
    Tensor ha = host_nhwc(s, 401), hb = host_nhwc(s, 402), hd = host_nhwc(s, 403);
    Tensor ac = c->upload_images(ha, pr.dt), ag = g->upload_images(ha, pr.dt);
    Tensor bc = c->upload_images(hb, pr.dt), bg = g->upload_images(hb, pr.dt);
    Tensor dc = c->upload_images(hd, pr.dt), dg = g->upload_images(hd, pr.dt);
    // Same storage dtype and the same shared math: results agree exactly.
    Tensor rc = c->relu_forward(ac), rg = g->relu_forward(ag);
    EXPECT_EQ(nerr(values(*g, rg), values(*c, rc)), 0.0);
    EXPECT_EQ(nerr(values(*g, g->relu_backward(dg, rg)), values(*c, c->relu_backward(dc, rc))),
              0.0);
    for (bool relu : {false, true}) {
      Tensor yc = c->add_forward(ac, bc, relu), yg = g->add_forward(ag, bg, relu);
      EXPECT_EQ(nerr(values(*g, yg), values(*c, yc)), 0.0);
      EXPECT_EQ(nerr(values(*g, g->add_backward(dg, yg, relu)),
                     values(*c, c->add_backward(dc, yc, relu))),
                0.0);
    }
  }
}

TEST_P(GpuOps, CastRoundTripsBitwiseLikeTheCpu) {
  REQUIRE_GPU();
  Prec pr = GetParam();
  if (pr.dt == DType::f32) GTEST_SKIP() << "casts are covered by the bf16 and fp16 cases";
  auto c = cpu();
  auto g = gpu();
  std::vector<float> v = normals(4099, 501, 1e4f);  // overflows fp16 at the tails
  v[7] = kNaN;
  v[8] = kInf;
  v[9] = 1e-7f;  // fp16 subnormal
  Tensor h = Tensor::host({int64_t(v.size())});
  std::memcpy(h.raw(), v.data(), v.size() * 4);
  auto rc = values(*c, c->cast(c->cast(c->from_host(h), pr.dt), DType::f32));
  auto rg = values(*g, g->cast(g->cast(g->from_host(h), pr.dt), DType::f32));
  ASSERT_EQ(rc.size(), rg.size());
  for (size_t i = 0; i < rc.size(); ++i) {
    if (std::isnan(rc[i]))
      EXPECT_TRUE(std::isnan(rg[i])) << i;
    else
      EXPECT_EQ(std::memcmp(&rc[i], &rg[i], 4), 0) << i << ": " << rc[i] << " vs " << rg[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, GpuOps, ::testing::ValuesIn(kPrecs), prec_name);

// ---- fp32-only ops: Linear (fp32 and tf32), loss, optimizer, overflow check -------------------

class GpuLinear : public ::testing::TestWithParam<bool> {};  // tf32

TEST_P(GpuLinear, ForwardAndBackward) {
  REQUIRE_GPU();
  bool tf32 = GetParam();
  double tol = tf32 ? 5e-3 : 1e-5;
  auto c = cpu();
  auto g = gpu(tf32);
  struct Case {
    int64_t n, k, m;
  };
  for (Case cs : {Case{1, 7, 3}, Case{5, 64, 10}, Case{33, 129, 17}}) {
    SCOPED_TRACE(std::to_string(cs.n) + "x" + std::to_string(cs.k) + "x" + std::to_string(cs.m));
    Tensor hx = host_plain({cs.n, cs.k}, 601), hw = host_plain({cs.m, cs.k}, 602);
    Tensor hb = host_plain({cs.m}, 603), hdy = host_plain({cs.n, cs.m}, 604);
    Tensor xc = c->from_host(hx), wc = c->from_host(hw), bc = c->from_host(hb);
    Tensor xg = g->from_host(hx), wg = g->from_host(hw), bg = g->from_host(hb);
    EXPECT_CLOSE(*g, g->linear_forward(xg, wg, bg), *c, c->linear_forward(xc, wc, bc), tol);
    Tensor dwc = c->zeros({cs.m, cs.k}), dbc = c->zeros({cs.m});
    Tensor dwg = g->zeros({cs.m, cs.k}), dbg = g->zeros({cs.m});
    g->fill(dwg, kNaN);
    g->fill(dbg, kNaN);
    Tensor dxc = c->linear_backward(c->from_host(hdy), xc, wc, dwc, dbc, true);
    Tensor dxg = g->linear_backward(g->from_host(hdy), xg, wg, dwg, dbg, true);
    EXPECT_CLOSE(*g, dxg, *c, dxc, tol);
    EXPECT_CLOSE(*g, dwg, *c, dwc, tol);
    EXPECT_CLOSE(*g, dbg, *c, dbc, 1e-5);
    EXPECT_FALSE(g->linear_backward(g->from_host(hdy), xg, wg, dwg, dbg, false).defined());
  }
}

INSTANTIATE_TEST_SUITE_P(MathMode, GpuLinear, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "tf32" : "fp32");
                         });

TEST(GpuLoss, SoftmaxCrossEntropyMatchesCpu) {
  REQUIRE_GPU();
  auto c = cpu();
  auto g = gpu();
  struct Case {
    int64_t n, m;
    float smoothing, scale;
  };
  for (Case cs : {Case{1, 10, 0.f, 1.f}, Case{37, 10, 0.1f, 128.f}, Case{5, 1000, 0.1f, 1.f}}) {
    SCOPED_TRACE(std::to_string(cs.n) + "x" + std::to_string(cs.m));
    Tensor hz = host_plain({cs.n, cs.m}, 700 + uint64_t(cs.m), 3.f);
    std::vector<int32_t> labels;
    Philox rng(701);
    for (int64_t i = 0; i < cs.n; ++i) labels.push_back(int32_t(rng.below(uint32_t(cs.m))));
    Tensor dc, dg;
    LossResult rc = c->softmax_xent(c->from_host(hz), labels.data(), cs.smoothing, cs.scale, &dc);
    LossResult rg = g->softmax_xent(g->from_host(hz), labels.data(), cs.smoothing, cs.scale, &dg);
    EXPECT_NEAR(rg.loss, rc.loss, 1e-9 * std::fabs(rc.loss));
    EXPECT_EQ(rg.top1, rc.top1);
    EXPECT_EQ(rg.top5, rc.top5);
    EXPECT_CLOSE(*g, dg, *c, dc, 1e-6);
    LossResult r2 =
        g->softmax_xent(g->from_host(hz), labels.data(), cs.smoothing, cs.scale, nullptr);
    EXPECT_DOUBLE_EQ(r2.loss, rg.loss);
  }
}

// The queued loss: what softmax_xent_queue leaves for queued_loss is what softmax_xent
// returns at once, on the GPU as on the CPU, and a second queue replaces the first.
TEST(GpuLoss, QueuedLossEqualsTheImmediateOne) {
  REQUIRE_GPU();
  auto c = cpu();
  auto g = gpu();
  const int64_t n = 33, m = 10;
  std::vector<int32_t> labels, labels_b;
  std::vector<float> lam;
  Philox rng(711);
  for (int64_t i = 0; i < n; ++i) {
    labels.push_back(int32_t(rng.below(uint32_t(m))));
    labels_b.push_back(int32_t(rng.below(uint32_t(m))));
    lam.push_back(rng.uniform());
  }
  const LabelMix mix{labels_b.data(), lam.data()};
  for (const LabelMix* mx : {static_cast<const LabelMix*>(nullptr), &mix}) {
    Tensor hz = host_plain({n, m}, 712, 3.f);
    Tensor dc, dg;
    const LossResult rc = c->softmax_xent(c->from_host(hz), labels.data(), 0.1f, 64.f, &dc, mx);
    g->softmax_xent_queue(g->from_host(host_plain({n, m}, 713)), labels.data(), 0.f, 1.f, nullptr, mx);
    g->softmax_xent_queue(g->from_host(hz), labels.data(), 0.1f, 64.f, &dg, mx);
    const LossResult rg = g->queued_loss();
    EXPECT_NEAR(rg.loss, rc.loss, 1e-9 * std::fabs(rc.loss));
    EXPECT_EQ(rg.top1, rc.top1);
    EXPECT_EQ(rg.top5, rc.top5);
    EXPECT_CLOSE(*g, dg, *c, dc, 1e-6);
  }
}

TEST(GpuOptimizer, FusedSgdMatchesCpuPerSegment) {
  REQUIRE_GPU();
  auto c = cpu();
  auto g = gpu();
  int64_t n = 3 * 8192 + 77;  // several chunks, a ragged tail
  std::vector<SgdSegment> segs = {{0, 1000, 1e-4f}, {1000, 20000, 0.f}, {21000, n - 21000, 5e-4f}};
  for (bool nesterov : {false, true}) {
    Tensor hp = host_plain({n}, 801), hgr = host_plain({n}, 802), hm = host_plain({n}, 803, 0.1f);
    Tensor pc = c->from_host(hp), gc = c->from_host(hgr), mc = c->from_host(hm);
    Tensor pg = g->from_host(hp), gg = g->from_host(hgr), mg = g->from_host(hm);
    SgdHyper h{0.05f, 0.9f, nesterov, 0.5f};
    for (int step = 0; step < 3; ++step) {
      c->sgd_step(pc, gc, mc, segs, h);
      g->sgd_step(pg, gg, mg, segs, h);
    }
    EXPECT_CLOSE(*g, pg, *c, pc, 1e-6);
    EXPECT_CLOSE(*g, mg, *c, mc, 1e-6);
  }
}

TEST(GpuOptimizer, UnscaleAndCheck) {
  REQUIRE_GPU();
  auto g = gpu();
  int64_t n = 100003;
  Tensor h = host_plain({n}, 901);
  Tensor t = g->from_host(h);
  EXPECT_FALSE(g->unscale_and_check(t, 0.25f));
  auto v = values(*g, t);
  for (int64_t i = 0; i < n; i += 997) EXPECT_EQ(v[size_t(i)], h.data<float>()[i] * 0.25f);
  for (float bad : {kInf, -kInf, kNaN}) {
    for (int64_t at : {int64_t(0), n / 2, n - 1}) {
      Tensor hb = host_plain({n}, 902);
      hb.data<float>()[at] = bad;
      Tensor tb = g->from_host(hb);
      EXPECT_TRUE(g->unscale_and_check(tb, 1.f)) << at;
    }
  }
  Tensor big = g->from_host(host_plain({n}, 903, 1e30f));
  EXPECT_TRUE(g->unscale_and_check(big, 1e10f)) << "overflow of the product itself";
  EXPECT_FALSE(g->unscale_and_check(t, 1.f)) << "no stale verdict";
}

// The queued verdict: unscale_check_queue scales like unscale_and_check and leaves the same
// verdict for queued_overflow, which a later queue replaces.
TEST(GpuOptimizer, QueuedOverflowVerdictEqualsTheImmediateOne) {
  REQUIRE_GPU();
  auto g = gpu();
  const int64_t n = 50021;
  Tensor h = host_plain({n}, 904);
  Tensor t = g->from_host(h);
  g->unscale_check_queue(t, 0.5f);
  EXPECT_FALSE(g->queued_overflow());
  auto v = values(*g, t);
  for (int64_t i = 0; i < n; i += 991) EXPECT_EQ(v[size_t(i)], h.data<float>()[i] * 0.5f);
  Tensor hb = host_plain({n}, 905);
  hb.data<float>()[n / 3] = kNaN;
  Tensor tb = g->from_host(hb);
  g->unscale_check_queue(tb, 1.f);
  EXPECT_TRUE(g->queued_overflow());
  g->unscale_check_queue(t, 1.f);
  EXPECT_FALSE(g->queued_overflow()) << "no stale verdict";
}

// The weights' moving average: dst += w * (src - dst), as the CPU computes it.
TEST(GpuOptimizer, LerpMatchesCpu) {
  REQUIRE_GPU();
  auto c = cpu();
  auto g = gpu();
  const int64_t n = 3 * 8192 + 5;
  Tensor hd = host_plain({n}, 906), hs = host_plain({n}, 907);
  Tensor dc = c->from_host(hd), sc = c->from_host(hs), dg = g->from_host(hd), sg = g->from_host(hs);
  for (float w : {0.5f, 2e-4f, 1.f}) {
    c->lerp(dc, sc, w);
    g->lerp(dg, sg, w);
    EXPECT_CLOSE(*g, dg, *c, dc, 1e-6);
  }
}

// Host copies into an existing buffer: copy_to_host at once, copy_to_host_async into pinned
// memory once its wait has returned; both equal to_host, every element written.
TEST(GpuBackend, CopiesToAHostBufferEqualToHost) {
  REQUIRE_GPU();
  auto g = gpu();
  const int64_t n = 1 << 20;
  Tensor src = g->from_host(host_plain({n}, 908));
  const std::vector<float> want = values(*g, src);
  Tensor pageable = Tensor::host({n});
  std::fill(pageable.data<float>(), pageable.data<float>() + n, kNaN);
  g->copy_to_host(src, pageable);
  EXPECT_EQ(std::memcmp(pageable.raw(), want.data(), size_t(n) * 4), 0);
  Tensor pinned({n}, DType::f32, g->host_staging_allocator());
  std::fill(pinned.data<float>(), pinned.data<float>() + n, kNaN);
  std::function<void()> wait = g->copy_to_host_async(src, pinned);
  g->fill(src, 7.f);  // queued after the copy: the copy holds the values before it
  wait();
  EXPECT_EQ(std::memcmp(pinned.raw(), want.data(), size_t(n) * 4), 0);
}

// ---- whole steps -----------------------------------------------------------------------------

struct TrainRun {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Model> model;
  std::unique_ptr<Sgd> sgd;
};

TrainRun make_run(std::unique_ptr<Backend> be, const char* fusion = "none") {
  TrainRun r;
  r.be = std::move(be);
  ResNetOptions o;
  o.arch = "resnet20";
  o.fusion = fusion;
  o.in_channels = 1;
  o.num_classes = 10;
  r.model = std::make_unique<Model>(build_resnet(o), *r.be);
  r.model->initialize(2024);
  r.sgd = std::make_unique<Sgd>(*r.model, SgdOptions{});
  return r;
}

struct Batch {
  Tensor images;
  std::vector<int32_t> labels;
};

// Fashion-MNIST-shaped batches (N, 1, 28, 28), the label a function of the image so the
// loss falls.
Batch batch(int64_t n, uint64_t seed) {
  Batch b;
  b.images = host_nhwc({n, 1, 28, 28}, seed);
  for (int64_t i = 0; i < n; ++i) {
    const float* p = b.images.data<float>() + i * 784;
    b.labels.push_back(int32_t(std::fabs(p[0] + p[400]) * 4.f) % 10);
  }
  return b;
}

// Sets `dst` (on its backend) to the values of `src` (on another).
void assign(Backend& dst_be, Tensor& dst, Backend& src_be, const Tensor& src) {
  Tensor staged = dst_be.from_host(src_be.to_host(src));
  dst_be.copy(staged, dst);
}

// The GPU's fp32 training step against the CPU's, from the same state at each of twenty
// points along the CPU's trajectory: the same loss, the same parameter update, the same
// running statistics. (Left to run free, two trajectories that differ only in rounding drift
// apart by several percent within twenty steps of this small-batch training, as two CPU runs
// with different thread counts do; so each step starts from the CPU's state instead.)
TEST(GpuTraining, TwentyStepsFollowTheCpuStepByStep) {
  REQUIRE_GPU();
  TrainRun c = make_run(cpu());
  TrainRun g = make_run(gpu(false, /*deterministic=*/true));
  // Same initial weights (the same Philox draws on both).
  EXPECT_EQ(nerr(values(*g.be, g.model->flat_params()), values(*c.be, c.model->flat_params())),
            0.0);
  LossScaler sc{LossScalerOptions{}}, sg{LossScalerOptions{}};
  StepRunner rc(*c.model, *c.sgd, sc, Precision::fp32), rg(*g.model, *g.sgd, sg, Precision::fp32);
  for (int step = 0; step < 20; ++step) {
    // The GPU takes the CPU's state: parameters, momentum, BN running statistics.
    assign(*g.be, g.model->flat_params(), *c.be, c.model->flat_params());
    assign(*g.be, g.sgd->momentum(), *c.be, c.sgd->momentum());
    for (size_t i = 0; i < g.model->buffers().size(); ++i)
      assign(*g.be, g.model->buffers()[i]->value, *c.be, c.model->buffers()[i]->value);
    std::vector<float> before = values(*c.be, c.model->flat_params());
    Batch b = batch(16, 1000 + uint64_t(step));
    double lc = rc.run(b.images, b.labels.data(), 0.05f, 0.1f).loss.loss;
    double lg = rg.run(b.images, b.labels.data(), 0.05f, 0.1f).loss.loss;
    EXPECT_NEAR(lg, lc, 1e-4 * std::fabs(lc)) << "step " << step;
    std::vector<float> pc = values(*c.be, c.model->flat_params());
    std::vector<float> pg = values(*g.be, g.model->flat_params());
    for (size_t i = 0; i < before.size(); ++i) {
      pc[i] -= before[i];
      pg[i] -= before[i];
    }
    // Measured on an H200: 0.3e-3 to 5.4e-3 (batch-norm backward over 16 small images
    // cancels heavily, and cuDNN's persistent NHWC kernels, the mode PyTorch also uses for
    // channels-last training, sum in another order than oneDNN). A wrong formula anywhere in
    // the step gives errors of order one.
    EXPECT_LE(nerr(pg, pc), 2e-2) << "parameter update, step " << step;
    for (size_t i = 0; i < g.model->buffers().size(); ++i)
      EXPECT_LE(nerr(values(*g.be, g.model->buffers()[i]->value),
                     values(*c.be, c.model->buffers()[i]->value)),
                1e-4)
          << g.model->buffers()[i]->name << ", step " << step;
  }
}

// Left to run free for twenty steps: a second GPU run with --deterministic repeats the first
// bit for bit, and the loss ends where the CPU's does (a loose bound that catches blow-ups;
// the step-by-step test above checks the arithmetic, for the reason given there).
TEST(GpuTraining, TwentyFreeStepsLearnAndRepeatBitwise) {
  REQUIRE_GPU();
  auto losses = [](TrainRun& r) {
    LossScaler s{LossScalerOptions{}};
    StepRunner runner(*r.model, *r.sgd, s, Precision::fp32);
    std::vector<double> l;
    for (int step = 0; step < 20; ++step) {
      Batch b = batch(16, 1000 + uint64_t(step));
      l.push_back(runner.run(b.images, b.labels.data(), 0.05f, 0.1f).loss.loss);
    }
    return l;
  };
  TrainRun c = make_run(cpu());
  TrainRun g = make_run(gpu(false, /*deterministic=*/true));
  std::vector<double> lc = losses(c), lg = losses(g);
  auto tail = [](const std::vector<double>& l) {
    double s = 0;
    for (size_t i = l.size() - 5; i < l.size(); ++i) s += l[i];
    return s / 5;
  };
  EXPECT_NEAR(tail(lg), tail(lc), 0.1 * tail(lc));
  TrainRun g2 = make_run(gpu(false, true));
  std::vector<double> l2 = losses(g2);
  for (int step = 0; step < 20; ++step)
    EXPECT_EQ(std::memcmp(&l2[size_t(step)], &lg[size_t(step)], sizeof(double)), 0)
        << "step " << step;
  EXPECT_EQ(std::memcmp(values(*g2.be, g2.model->flat_params()).data(),
                        values(*g.be, g.model->flat_params()).data(),
                        size_t(g.model->flat_params().numel()) * 4),
            0);
}

TEST(GpuTraining, Fp16OverflowSkipsTheStepAndHalvesTheScale) {
  REQUIRE_GPU();
  TrainRun g = make_run(gpu());
  Batch b = batch(8, 1100);
  auto p0 = values(*g.be, g.model->flat_params()), m0 = values(*g.be, g.sgd->momentum());
  LossScalerOptions o;
  o.enabled = true;
  o.init_scale = std::ldexp(1.0, 40);
  LossScaler huge(o);
  StepResult r =
      StepRunner(*g.model, *g.sgd, huge, Precision::fp16).run(b.images, b.labels.data(), 0.1f, 0.f);
  EXPECT_TRUE(r.overflow);
  EXPECT_TRUE(std::isfinite(r.loss.loss));
  EXPECT_EQ(huge.scale(), std::ldexp(1.0, 39));
  EXPECT_EQ(g.sgd->steps(), 0);
  auto p1 = values(*g.be, g.model->flat_params()), m1 = values(*g.be, g.sgd->momentum());
  ASSERT_EQ(p1.size(), p0.size());
  EXPECT_EQ(std::memcmp(p0.data(), p1.data(), p0.size() * 4), 0) << "params changed on overflow";
  EXPECT_EQ(std::memcmp(m0.data(), m1.data(), m0.size() * 4), 0) << "momentum changed on overflow";
  // A scale that fits: the step is applied.
  o.init_scale = 1024;
  LossScaler fits(o);
  r = StepRunner(*g.model, *g.sgd, fits, Precision::fp16).run(b.images, b.labels.data(), 0.1f, 0.f);
  EXPECT_FALSE(r.overflow);
  EXPECT_EQ(g.sgd->steps(), 1);
  auto p2 = values(*g.be, g.model->flat_params());
  EXPECT_NE(std::memcmp(p1.data(), p2.data(), p1.size() * 4), 0) << "params did not change";
}

// --fusion bn at fp16 on the GPU (cuDNN's graphs where it takes resnet20's shapes): from the
// same weights, the unfused run's losses, step for step, up to fp16 rounding.
TEST(GpuTraining, FusedFp16StepsFollowTheUnfusedSteps) {
  REQUIRE_GPU();
  TrainRun plain = make_run(gpu()), fused = make_run(gpu(), "bn");
  LossScaler sp{LossScalerOptions{}}, sf{LossScalerOptions{}};
  StepRunner rp(*plain.model, *plain.sgd, sp, Precision::fp16),
      rf(*fused.model, *fused.sgd, sf, Precision::fp16);
  for (int step = 0; step < 5; ++step) {
    Batch b = batch(32, 1500 + uint64_t(step));
    StepResult a = rp.run(b.images, b.labels.data(), 0.05f, 0.1f);
    StepResult f = rf.run(b.images, b.labels.data(), 0.05f, 0.1f);
    EXPECT_EQ(f.overflow, a.overflow) << "step " << step;
    EXPECT_NEAR(f.loss.loss, a.loss.loss, (step == 0 ? 2e-3 : 2e-2) * a.loss.loss) << "step " << step;
  }
  EXPECT_LE(nerr(values(*fused.be, fused.model->flat_params()),
                 values(*plain.be, plain.model->flat_params())), 1e-2);
  for (const std::string& l : fused.be->kernel_choices())
    if (l.find("graph: accepted") != std::string::npos) std::printf("  %s\n", l.c_str());
}

// On the GPU, steps queued back to back (the loss and overflow verdict read a step later, the
// update skipped by the device's own flag) against the step read at once: the same verdicts
// and scales, and with --deterministic bitwise the same weights.
TEST(GpuTraining, QueuedFp16StepsEqualStepsReadAtOnce) {
  REQUIRE_GPU();
  TrainRun a = make_run(gpu(false, /*deterministic=*/true));
  TrainRun q = make_run(gpu(false, /*deterministic=*/true));
  LossScaler sa = bouncing_scaler(), sq = bouncing_scaler();
  StepRunner runner(*q.model, *q.sgd, sq, Precision::fp16);
  std::vector<StepResult> ra, rq;
  const int kSteps = 30;
  for (int i = 0; i < kSteps; ++i) {
    Batch b = batch(16, 1300 + uint64_t(i));
    ra.push_back(reference_step(*a.model, *a.sgd, sa, DType::f16, b.images, b.labels.data(),
                                0.05f, 0.1f));
    runner.queue(b.images, b.labels.data(), 0.05f, 0.1f);
    for (const StepResult& r : runner.take_results()) rq.push_back(r);
  }
  runner.settle();
  for (const StepResult& r : runner.take_results()) rq.push_back(r);
  ASSERT_EQ(rq.size(), ra.size());
  const int overflows = expect_same_results(rq, ra);
  EXPECT_GT(overflows, 2);
  EXPECT_LT(overflows, kSteps - 5);
  auto pa = values(*a.be, a.model->flat_params()), pq = values(*q.be, q.model->flat_params());
  EXPECT_EQ(std::memcmp(pa.data(), pq.data(), pa.size() * 4), 0);
  EXPECT_EQ(q.sgd->steps(), a.sgd->steps());
  EXPECT_EQ(sq.scale(), sa.scale());
}

// ---- captured steps (--cuda-graph) -----------------------------------------------------------

// Runs kSteps steps on `runner` (queued back to back) and returns their figures in order.
std::vector<StepResult> queued_steps(StepRunner& runner, int steps, uint64_t seed, bool mixed) {
  std::vector<StepResult> out;
  for (int i = 0; i < steps; ++i) {
    Batch b = batch(16, seed + uint64_t(i));
    std::vector<int32_t> labels_b(b.labels.rbegin(), b.labels.rend());
    std::vector<float> lam(b.labels.size());
    for (size_t k = 0; k < lam.size(); ++k) lam[k] = 0.25f + 0.5f * float(k) / float(lam.size());
    const LabelMix mix{labels_b.data(), lam.data()};
    runner.queue(b.images, b.labels.data(), 0.05f, 0.1f, nullptr, mixed ? &mix : nullptr);
    for (const StepResult& r : runner.take_results()) out.push_back(r);
  }
  runner.settle();
  for (const StepResult& r : runner.take_results()) out.push_back(r);
  return out;
}

// Two deterministic GPU runs of the same steps, one eager and one replaying a captured step:
// the same losses, verdicts and scales, bitwise the same weights and momentum, and an eager
// evaluation forward afterwards sees the replayed weights (their compute copies refreshed).
void expect_captured_equals_eager(const Prec& pr, bool mixed) {
  TrainRun e = make_run(gpu(pr.tf32, /*deterministic=*/true));
  TrainRun c = make_run(gpu(pr.tf32, /*deterministic=*/true));
  const bool fp16 = pr.dt == DType::f16;
  LossScaler se = fp16 ? bouncing_scaler() : LossScaler(LossScalerOptions{});
  LossScaler sc = fp16 ? bouncing_scaler() : LossScaler(LossScalerOptions{});
  StepRunner re(*e.model, *e.sgd, se, precision_of(pr));
  StepRunner rc(*c.model, *c.sgd, sc, precision_of(pr));
  rc.use_captured_steps();
  const int kSteps = 14;
  std::vector<StepResult> ge = queued_steps(re, kSteps, 1400, mixed);
  std::vector<StepResult> gc = queued_steps(rc, kSteps, 1400, mixed);
  ASSERT_EQ(ge.size(), size_t(kSteps));
  ASSERT_EQ(gc.size(), size_t(kSteps));
  const int overflows = expect_same_results(gc, ge);
  // Losses that change from step to step: the replays read each step's own labels and weights.
  EXPECT_NE(gc.back().loss.loss, gc[StepRunner::kEagerBeforeCapture + 1].loss.loss);
  if (fp16) {  // replays both skipped and applied updates
    EXPECT_GT(overflows, 1);
    EXPECT_LT(overflows, kSteps - 4);
  }
  auto pe = values(*e.be, e.model->flat_params()), pc = values(*c.be, c.model->flat_params());
  EXPECT_EQ(std::memcmp(pe.data(), pc.data(), pe.size() * 4), 0) << "weights differ";
  auto me = values(*e.be, e.sgd->momentum()), mc = values(*c.be, c.sgd->momentum());
  EXPECT_EQ(std::memcmp(me.data(), mc.data(), me.size() * 4), 0) << "momentum differs";
  EXPECT_EQ(c.sgd->steps(), e.sgd->steps());
  EXPECT_EQ(sc.scale(), se.scale());
  Batch t = batch(16, 99);
  auto le = values(*e.be, e.model->forward(e.be->upload_images(t.images, pr.dt), false));
  auto lc = values(*c.be, c.model->forward(c.be->upload_images(t.images, pr.dt), false));
  EXPECT_EQ(std::memcmp(le.data(), lc.data(), le.size() * 4), 0) << "evaluation saw stale weights";
  EXPECT_GT(c.be->capture()->reserved_bytes(), 0u);
}

class GpuCapture : public ::testing::TestWithParam<Prec> {};

TEST_P(GpuCapture, ReplayedStepsEqualEagerSteps) {
  REQUIRE_GPU();
  expect_captured_equals_eager(GetParam(), /*mixed=*/false);
}

INSTANTIATE_TEST_SUITE_P(Precisions, GpuCapture, ::testing::ValuesIn(kPrecs), prec_name);

TEST(GpuCaptureMixed, ReplayedStepsWithMixedTargetsEqualEagerSteps) {
  REQUIRE_GPU();
  expect_captured_equals_eager(kPrecs[3], /*mixed=*/true);  // fp16
}

// A batch unlike the captured one is refused with the reason, not replayed over.
TEST(GpuCaptureMixed, ABatchOfAnotherSizeIsRefused) {
  REQUIRE_GPU();
  TrainRun c = make_run(gpu());
  LossScaler s{LossScalerOptions{}};
  StepRunner runner(*c.model, *c.sgd, s, Precision::bf16);
  runner.use_captured_steps();
  for (int i = 0; i <= StepRunner::kEagerBeforeCapture; ++i) {
    Batch b = batch(16, 1500 + uint64_t(i));
    runner.run(b.images, b.labels.data(), 0.05f, 0.f);
  }
  Batch small = batch(8, 1600);
  try {
    runner.run(small.images, small.labels.data(), 0.05f, 0.f);
    FAIL() << "a batch of 8 was replayed through a step captured for 16";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cuda-graph"), std::string::npos) << e.what();
  }
}

class GpuAllocator : public ::testing::TestWithParam<Prec> {};

TEST_P(GpuAllocator, SteadyStateStepsAllocateNothingNew) {
  REQUIRE_GPU();
  Prec pr = GetParam();
  TrainRun g = make_run(gpu(pr.tf32));
  LossScalerOptions o;
  o.enabled = pr.dt == DType::f16;
  o.init_scale = 1024;
  LossScaler s(o);
  StepRunner runner(*g.model, *g.sgd, s, precision_of(pr));
  Batch b = batch(32, 1200);
  for (int i = 0; i < 3; ++i) runner.run(b.images, b.labels.data(), 0.05f, 0.f);
  g.be->synchronize();
  AllocatorStats before = g.be->allocator().stats();
  for (int i = 0; i < 5; ++i) runner.run(b.images, b.labels.data(), 0.05f, 0.f);
  g.be->synchronize();
  AllocatorStats after = g.be->allocator().stats();
  EXPECT_EQ(after.system_allocs, before.system_allocs) << "cudaMalloc in a steady-state step";
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(after.current_bytes, before.current_bytes) << "device memory leaks per step";
  EXPECT_GT(after.peak_bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(Precisions, GpuAllocator, ::testing::ValuesIn(kPrecs), prec_name);

// ---- without a GPU ---------------------------------------------------------------------------

// cuBLAS is not loaded at start-up (it costs ~210 MB RSS) but on first use, and loading it
// needs no GPU: the library CMake found resolves, with the version the build was made with.
TEST(GpuBackend, CublasLoadsOnFirstUse) {
#ifdef SPOTRAIN_WITH_CUDA
  int devices = 0;
  bool gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  cudaGetLastError();
  if (!gpu)  // (with a GPU, backends made by earlier tests in this process load it)
    EXPECT_FALSE(spotrain::cuda::blas::loaded()) << "cuBLAS was loaded before any use";
  std::string v = spotrain::cuda::blas::version();
  EXPECT_TRUE(spotrain::cuda::blas::loaded());
  EXPECT_EQ(v.rfind(std::to_string(CUBLAS_VER_MAJOR) + ".", 0), 0u) << v;
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuBackend, WithoutADeviceCudaFailsCleanlyAndAutoPicksTheCpu) {
  if (have_gpu()) GTEST_SKIP() << "a CUDA device is present";
  try {
    make_backend("cuda", BackendOptions{});
    FAIL() << "make_backend(\"cuda\") succeeded without a device";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_TRUE(m.find("no CUDA device") != std::string::npos ||
                m.find("no CUDA support") != std::string::npos)
        << m;
  }
  EXPECT_EQ(make_backend("auto", BackendOptions{})->device(), Device::cpu);
}

// ---- image upload from the loader's host staging memory ---------------------------------

TEST(HostStaging, CpuBackendUsesTheHostAllocator) {
  EXPECT_EQ(&cpu()->host_staging_allocator(), &Allocator::host());
}

// The loader writes batches into the backend's host staging memory (pinned on CUDA); the
// upload from it (one async DMA, no staging copy) must equal the pageable path's.
TEST(HostStaging, PinnedAndPageableUploadsAgree) {
  REQUIRE_GPU();
  auto g = gpu();
  Allocator& pinned = g->host_staging_allocator();
  ASSERT_NE(&pinned, &Allocator::host());
  EXPECT_EQ(pinned.device(), Device::cpu);
  const Shape s{3, 5, 9, 7};
  for (DType dt : {DType::f32, DType::bf16}) {
    std::vector<Tensor> from_pinned, from_pageable;
    std::vector<std::vector<float>> want;
    // Several uploads in flight at once, the pinned sources dropped right after each upload.
    for (int i = 0; i < 5; ++i) {
      Tensor pageable = host_nhwc(s, 1400 + uint64_t(i));
      Tensor src(s, DType::f32, pinned, Layout::nhwc);
      std::memcpy(src.raw(), pageable.raw(), pageable.nbytes());
      const void* addr = src.raw();
      from_pinned.push_back(g->upload_images(src, dt));
      src = Tensor();
      // The backend still holds the source until its copy is done: new staging memory must
      // not reuse it, and writing into the new one must not change the upload.
      Tensor next(s, DType::f32, pinned, Layout::nhwc);
      EXPECT_NE(next.raw(), addr);
      std::memset(next.raw(), 0x7f, next.nbytes());
      from_pageable.push_back(g->upload_images(pageable, dt));
    }
    g->synchronize();
    for (size_t i = 0; i < from_pinned.size(); ++i) {
      auto a = values(*g, from_pinned[i]), b = values(*g, from_pageable[i]);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "upload " << i;
    }
  }
#ifdef SPOTRAIN_WITH_CUDA
  Tensor src(s, DType::f32, pinned, Layout::nhwc);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, src.raw()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  Tensor pageable = Tensor::host(s, DType::f32, Layout::nhwc);
  ASSERT_EQ(cudaPointerGetAttributes(&attr, pageable.raw()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeUnregistered);
#endif
}

// bn_infer (kernels/elementwise.h) is what the GPU's inference kernel runs: check it on the
// CPU against oneDNN's inference batch norm.
TEST(SharedMath, BnInferMatchesTheCpuBackend) {
  auto c = cpu();
  Shape s{2, 5, 3, 4};
  Tensor hx = host_nhwc(s, 1301);
  Tensor hg = host_plain({5}, 1302, 0.2f, 1.f), hb = host_plain({5}, 1303);
  Tensor hm = host_plain({5}, 1304), hv = host_plain({5}, 1305, 0.1f, 1.f);
  for (bool relu : {false, true}) {
    auto y =
        values(*c, c->batchnorm_forward_infer(c->from_host(hx), c->from_host(hg), c->from_host(hb),
                                              c->from_host(hm), c->from_host(hv), 1e-5f, relu));
    // values() is NCHW; hx is NHWC.
    std::vector<float> want(y.size());
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t ch = 0; ch < 5; ++ch)
        for (int64_t p = 0; p < 12; ++p) {
          float v =
              bn_infer(hx.data<float>()[(n * 12 + p) * 5 + ch], hm.data<float>()[ch],
                       hv.data<float>()[ch], hg.data<float>()[ch], hb.data<float>()[ch], 1e-5f);
          want[size_t((n * 5 + ch) * 12 + p)] = relu ? relu_fwd(v) : v;
        }
    EXPECT_LE(nerr(y, want), 1e-6);
  }
}

}  // namespace
