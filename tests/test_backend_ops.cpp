// The op suite as tests: every case of health/op_cases.h (the cases `spotrain doctor` runs too)
// on each backend under test against the float64 reference (kernels/reference/), one test per
// target and case, each failed check reported by its line; then what only a test checks
// (refusals, kernel choices).
//
// Backends under test: the CPU in its blocked layout at fp32 (the path CPU training takes) and
// at 16 bits (bf16, fp16: 16-bit storage, its own casts and fp32 fallbacks), and in the other
// layout (NHWC), which CI runs on every commit, so the suite's own logic, layouts and
// tolerances are tried before a GPU ever sees them; and the CUDA backend (fp32, tf32, bf16,
// fp16), which skips without a GPU. The blocked CPU refuses operands in mixed layouts, so a
// case that feeds the backend under test an activation in the wrong layout fails here (two
// such test bugs once reached an H200); the reference takes NHWC activations only.
// tests/check_op_coverage.cmake checks that every op of kernels/ops.h is called on the backend
// under test by the shared cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/error.h"
#include "core/environment.h"
#include "health/op_cases.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/ops.h"

using namespace spotrain;
using namespace spotrain::health;

namespace spotrain::health {
void PrintTo(const OpTarget& t, std::ostream* os) { *os << t.device << "_" << t.name; }
}  // namespace spotrain::health

namespace {

// The backend under test and the reference for target t, as the doctor makes them (2 threads:
// CI's machines are small and shared; a GPU times its kernels' candidates, as training does);
// a CUDA target skips without a GPU.
struct Backends {
  std::unique_ptr<Backend> be, ref;
};
bool make_backends(const OpTarget& t, Backends& out) {
  if (std::string(t.device) == "cuda" && !cuda_backend_ready()) return false;
  out.be = make_op_backend(t, 2);
  out.ref = make_op_reference();
  return true;
}

// What a GPU adds to a case, on the backend the case ran on: which kernels and cuDNN graphs
// ran per shape (printed: which graphs this GPU and cuDNN take is what the case is for on a
// new one), and for the conv + batch-norm fusion, that a graph ran exactly where cuDNN
// accepted it (fp32 has none).
void gpu_kernel_choices(const std::string& op_case, Backend& be, DType dt) {
  if (op_case == "FusedPrologueHoldsAtPaddedAndStridedConvolutions") {
    for (const std::string& l : be.kernel_choices())
      if (l.rfind("conv ", 0) == 0) std::printf("  %s\n", l.c_str());
    return;
  }
  if (op_case != "ConvolutionWithBatchNormStatisticsAndPrologue") return;
  auto verdict = [&](const char* input, const char* graph) {
    for (const std::string& l : be.kernel_choices()) {
      if (l.rfind("conv ", 0) != 0 || l.find(input) == std::string::npos) continue;
      std::printf("  %s\n", l.c_str());
      size_t at = l.find(std::string(", ") + graph + " graph: ");
      return at == std::string::npos ? std::string("none") : l.substr(at, l.find(')', at) - at);
    }
    return std::string("no such shape");
  };
  // conv1's statistics graph, conv2's prologue graph and its backward graphs
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

// ---- the shared cases: one test per (target, case) ------------------------------------------

using TargetAndCase = std::tuple<OpTarget, size_t>;  // a target, an index into op_cases()

class BackendOps : public ::testing::TestWithParam<TargetAndCase> {};

// Each case on a fresh backend: every check it made passes, and it made at least one.
TEST_P(BackendOps, Case) {
  const OpTarget& t = std::get<0>(GetParam());
  const OpCase& c = op_cases()[std::get<1>(GetParam())];
  Backends b;
  if (!make_backends(t, b)) GTEST_SKIP() << "no CUDA device";
  const std::vector<OpCheck> checks = run_op_case(c, *b.be, *b.ref, t);
  EXPECT_FALSE(checks.empty()) << c.name << " made no check";
  for (const OpCheck& k : checks) EXPECT_TRUE(k.passed()) << k.line();
  if (b.be->device() == Device::cuda) gpu_kernel_choices(c.name, *b.be, t.dt);
}

// "ConvolutionForwardBackwardDataAndWeights_nhwc_fp32"
std::string case_name(const ::testing::TestParamInfo<TargetAndCase>& i) {
  return std::string(op_cases()[std::get<1>(i.param)].name) + "_" + std::get<0>(i.param).name;
}

INSTANTIATE_TEST_SUITE_P(Cpu, BackendOps,
                         ::testing::Combine(::testing::ValuesIn(cpu_op_targets()),
                                            ::testing::Range(size_t(0), op_cases().size())),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Cuda, BackendOps,
                         ::testing::Combine(::testing::ValuesIn(cuda_op_targets()),
                                            ::testing::Range(size_t(0), op_cases().size())),
                         case_name);

// ---- what only the tests check, per target --------------------------------------------------

class BackendOpsTarget : public ::testing::TestWithParam<OpTarget> {
 protected:
  void SetUp() override {
    if (!make_backends(GetParam(), b)) GTEST_SKIP() << "no CUDA device";
    be = b.be.get();
  }
  Backends b;
  Backend* be = nullptr;
};
std::string target_name(const ::testing::TestParamInfo<OpTarget>& i) { return i.param.name; }

// The CPU target named `name`.
const OpTarget& cpu_target(const std::string& name) {
  for (const OpTarget& t : cpu_op_targets())
    if (name == t.name) return t;
  throw Error("no CPU target " + name);
}

// upload_pixels takes 8-bit pixels only.
TEST_P(BackendOpsTarget, UploadPixelsRefusesFloatValues) {
  Tensor h = host_nhwc({2, 5, 7, 3}, 910);
  EXPECT_THROW(be->upload_pixels(h, PixelNorm{}, GetParam().dt), Error);  // fp32 is not 8-bit pixels
}

// kernel_choices: after a convolution and a batch norm ran, a GPU names per shape what cuDNN
// settled on (a plain convolution names no fusion graph: none was planned for it); the CPU
// has no choice to report.
TEST_P(BackendOpsTarget, KernelChoicesNameWhatEachShapeRan) {
  EXPECT_TRUE(be->kernel_choices().empty()) << "nothing has run yet";
  Tensor x = be->upload_activation(host_nhwc({2, 8, 6, 6}, 301), GetParam().dt);
  Tensor w = be->from_host(host_plain({16, 8, 3, 3}, 302, 0.1f));
  Tensor y = be->conv2d_forward(x, w, ConvParams{3, 3, 1, 1});
  BnParams pb = bn_params(*be, host_plain({16}, 303, 0.2f, 1.f), host_plain({16}, 304, 0.5f));
  BnSaved sb;
  be->batchnorm_forward_train(y, pb.gamma, pb.beta, 1e-5f, /*relu=*/true, sb);
  if (be->device() != Device::cuda) {
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

// A step's span on the device's clock (stragglers on GPU ranks): the CPU marks nothing (-1:
// its host clock sees the compute); a GPU gives each marked span, the latest completed, no
// longer than the host saw from before the first mark to after reading it, and two spans
// alternate so the one before is read while the next is marked.
TEST_P(BackendOpsTarget, AStepSpanIsTheDevicesTimeBetweenItsMarks) {
  EXPECT_EQ(be->step_span_seconds(), -1.0) << "nothing marked yet";
  Tensor x = be->upload_activation(host_nhwc({4, 16, 12, 12}, 311), GetParam().dt);
  Tensor w = be->from_host(host_plain({16, 16, 3, 3}, 312, 0.1f));
  const double t0 = now_seconds();
  be->mark_step_begin();
  for (int i = 0; i < 4; ++i) x = be->conv2d_forward(x, w, ConvParams{3, 3, 1, 1});
  be->mark_step_backward_done();
  be->mark_step_begin();  // the next step's begin: the span read is still the first one's
  Tensor y = be->conv2d_forward(x, w, ConvParams{3, 3, 1, 1});
  const double span = be->step_span_seconds();
  const double host = now_seconds() - t0;
  be->mark_step_backward_done();
  if (be->device() != Device::cuda) {
    EXPECT_EQ(span, -1.0);
    EXPECT_EQ(be->step_span_seconds(), -1.0);
    return;
  }
  EXPECT_GT(span, 0.0);
  EXPECT_LE(span, host);
  const double second = be->step_span_seconds();
  EXPECT_GT(second, 0.0);
  EXPECT_LE(second, now_seconds() - t0);
}

// A backend that makes a batch norm + ReLU's output again in backward (the CPU: the
// convolution reading it does not keep it) gets the training forward's output back from the
// inference op on the training statistics; a GPU keeps the output instead.
TEST_P(BackendOpsTarget, ARemadeBnReluOutputIsTheForwardsOwn) {
  EXPECT_EQ(be->remakes_bn_relu_inputs(), be->device() == Device::cpu);
  Tensor x = be->upload_activation(host_nhwc({4, 32, 10, 10}, 320), GetParam().dt);
  BnParams pb = bn_params(*be, host_plain({32}, 321, 0.2f, 1.f), host_plain({32}, 322, 0.5f));
  BnSaved sb;
  Tensor y = be->batchnorm_forward_train(x, pb.gamma, pb.beta, 1e-5f, /*relu=*/true, sb);
  Tensor again = be->batchnorm_forward_infer(x, pb.gamma, pb.beta, sb.mean, sb.var, 1e-5f, true);
  Tensor hy = be->to_host(y), ha = be->to_host(again);
  const float* a = hy.data<float>();
  const float* b = ha.data<float>();
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < hy.numel(); ++i) {
    worst = std::max(worst, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(a[i])));
  }
  // At most one rounding step of the stored dtype apart (the two ops may round differently).
  const double ulp = GetParam().dt == DType::f32 ? 1e-5 : GetParam().dt == DType::bf16 ? 8e-3 : 1e-3;
  EXPECT_LE(worst, ulp * scale) << "remade output differs by " << worst << " of " << scale;
}

INSTANTIATE_TEST_SUITE_P(Cpu, BackendOpsTarget, ::testing::ValuesIn(cpu_op_targets()), target_name);
INSTANTIATE_TEST_SUITE_P(Cuda, BackendOpsTarget, ::testing::ValuesIn(cuda_op_targets()), target_name);

// ---- the shared cases' own footing ----------------------------------------------------------

// A check's line names the op, the target and the shape; a case that throws becomes one failed
// check naming the case, where it stopped and the message, and the cases after it still run.
TEST(BackendOpsHarness, ChecksNameTheirCauseAndAnErrorStopsOnlyItsCase) {
  auto be = make_backend("cpu", BackendOptions{});
  const OpTarget& t = cpu_target("nhwc_fp32");
  OpCaseRun r(*be, *be, t, "Example");
  {
    auto at = r.scope("[2,16,9,9] k3 s2");
    EXPECT_FALSE(r.near("conv2d_forward", 0.31, 1e-5));
    EXPECT_FALSE(r.near("conv2d_forward", std::numeric_limits<double>::quiet_NaN(), 1.0));
  }
  EXPECT_TRUE(r.expect("exact", true));
  ASSERT_EQ(r.checks().size(), 3u);
  EXPECT_EQ(r.checks()[0].line(),
            "fail  op conv2d_forward nhwc_fp32 [2,16,9,9] k3 s2: normalized error 3.1e-01 > 1.0e-05");
  EXPECT_FALSE(r.checks()[1].passed()) << "a NaN error passed";
  EXPECT_EQ(r.checks()[2].line(), "pass  op exact nhwc_fp32: holds");

  const OpCase throws{"Throws", [](OpCaseRun& run) {
                        auto at = run.scope("[1,2,3,4]");
                        run.expect("before", true);
                        throw Error("the backend gave up");
                      }};
  const std::vector<OpCheck> checks = run_op_case(throws, *be, *be, t);
  ASSERT_EQ(checks.size(), 2u);
  EXPECT_TRUE(checks[0].passed());
  EXPECT_FALSE(checks[1].passed());
  EXPECT_EQ(checks[1].line(),
            "fail  op case Throws nhwc_fp32 [1,2,3,4]: stopped by an error: the backend gave up");
  // A filter picks cases by name.
  const std::vector<OpCheck> lerp = run_op_cases(*be, *be, t, "Lerp");
  ASSERT_FALSE(lerp.empty());
  for (const OpCheck& c : lerp) EXPECT_EQ(c.op_case, "LerpMatchesTheReference");
}

// The doctor runs every case in turn on one backend (the tests give each case a fresh one):
// no case depends on a backend that has run nothing before it.
TEST(BackendOpsHarness, EveryCasePassesOnOneSharedBackend) {
  const OpTarget& t = cpu_target("nhwc_bf16");
  Backends b;
  ASSERT_TRUE(make_backends(t, b));
  const std::vector<OpCheck> checks = run_op_cases(*b.be, *b.ref, t);
  size_t cases = 0;
  for (size_t i = 0; i < checks.size(); ++i) {
    EXPECT_TRUE(checks[i].passed()) << checks[i].line();
    cases += i == 0 || checks[i].op_case != checks[i - 1].op_case;
  }
  EXPECT_EQ(cases, op_cases().size());
}

// A planted wrong op (SPOTRAIN_WRONG_OP: make_op_backend wraps the backend under test, which
// then doubles that op's output) fails exactly the checks of that op, each by a normalized
// error of 1 against the float64 reference (which no planted op reaches); the rest pass.
TEST(BackendOpsHarness, APlantedWrongOpFailsItsOwnChecksOnly) {
  struct Planted {
    Planted() { test_hooks_for_test().wrong_ops = {"conv2d_forward"}; }
    ~Planted() { test_hooks_for_test().wrong_ops.clear(); }
  };
  const OpTarget& t = cpu_target("blocked_fp32");
  std::vector<OpCheck> checks;
  {
    Planted planted;
    Backends b;
    ASSERT_TRUE(make_backends(t, b));
    checks = run_op_cases(*b.be, *b.ref, t, "ConvolutionForwardBackwardDataAndWeights");
  }
  int wrong = 0;
  for (const OpCheck& c : checks) {
    const bool forward = c.what.rfind("conv2d_forward", 0) == 0 && c.what.find("output") == std::string::npos;
    EXPECT_EQ(c.passed(), !forward) << c.line();
    if (!forward) continue;
    ++wrong;
    EXPECT_NEAR(c.err, 1.0, 1e-6) << c.line();
  }
  EXPECT_EQ(wrong, 3 * 5 * 2) << "three forward checks, five shapes, two kinds of input";
}

// Shifted inputs are what they claim: each channel's mean 3 to 5 standard deviations off zero.
TEST(BackendOpsHarness, ShiftedInputsLieThreeToFiveDeviationsOffZero) {
  const Shape s{8, 16, 6, 6};
  const Tensor h = host_nhwc_shifted(s, 17, 2.f);
  const std::vector<double> m = channel_means(h);
  for (int64_t c = 0; c < s[1]; ++c) {
    double var = 0;
    int64_t n = 0;
    for (int64_t i = c; i < h.numel(); i += s[1], ++n) {
      const double d = h.data<float>()[i] - m[size_t(c)];
      var += d * d;
    }
    const double off = std::fabs(m[size_t(c)]) / std::sqrt(var / double(n));
    EXPECT_GT(off, 2.5) << "channel " << c;
    EXPECT_LT(off, 5.8) << "channel " << c;
  }
}

// ---- the suite's own footing ------------------------------------------------------------------

// The blocked CPU target refuses operands in two layouts: an activation fed to it in the wrong
// layout (an upload_images tensor where a layer in the middle of a network takes its input) ends
// the test with an error instead of comparing a wrong result.
TEST(BackendOpsLayouts, TheBlockedCpuRefusesAnActivationInTheWrongLayout) {
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

// What `spotrain bench` prints as "at the peak, GiB by what allocated it": the bytes live at
// the peak under each AllocScope (innermost wins), not what was freed before it.
TEST(BackendOpsMemory, AllocScopesNameWhatWasLiveAtThePeak) {
  Allocator a(Device::cpu);
  const size_t mib = size_t(1) << 20;
  void* outer;
  void* inner;
  void* gone;
  {
    AllocScope s1("test: outer");
    outer = a.allocate(4 * mib);
    {
      AllocScope s2("test: inner");
      inner = a.allocate(2 * mib);
      EXPECT_STREQ(AllocScope::current(), "test: inner");
    }
    gone = a.allocate(mib);
  }
  EXPECT_STREQ(AllocScope::current(), AllocScope::kUnscoped);
  a.deallocate(gone, mib);
  a.reset_peak();  // the peak from here: outer and inner only
  void* later = a.allocate(3 * mib);  // unscoped, and a new peak
  auto by = a.peak_by_scope();
  ASSERT_EQ(by.size(), 3u);
  EXPECT_EQ(by[0], std::make_pair(std::string("test: outer"), 4 * mib));
  EXPECT_EQ(by[1], std::make_pair(std::string(AllocScope::kUnscoped), 3 * mib));
  EXPECT_EQ(by[2], std::make_pair(std::string("test: inner"), 2 * mib));
  for (auto [p, n] : {std::pair{outer, 4 * mib}, {inner, 2 * mib}, {later, 3 * mib}}) a.deallocate(p, n);
}

// Weights reordered into oneDNN's format live only as long as their op while each version
// meets that format once or twice (training), and are kept from the third use of a version
// (evaluation, accumulation, replays): a kept copy held for a whole step was up to two
// weight sets more at the peak (ResNet-50 fp32: 0.15 GiB).
TEST(BackendOpsMemory, WeightCopiesLiveOnlyForTheirOpUntilAVersionIsUsedAgain) {
  auto be = make_backend("cpu", BackendOptions{});
  Tensor x = be->upload_activation(host_nhwc({2, 64, 8, 8}, 960), DType::f32);
  Tensor w = be->from_host(host_plain({64, 64, 3, 3}, 961, 0.1f));
  Allocator& host = Allocator::host();
  const size_t wbytes = w.nbytes();
  auto held_after_forward = [&] {
    const size_t before = host.stats().current_bytes;
    { Tensor y = be->conv2d_forward(x, w, ConvParams{3, 3, 1, 1}); }
    return host.stats().current_bytes - before;
  };
  EXPECT_LT(held_after_forward(), wbytes / 2) << "first use of a version kept its copy";
  w.mark_written();  // an optimizer step: a new version
  EXPECT_LT(held_after_forward(), wbytes / 2) << "first use of a new version kept its copy";
  EXPECT_LT(held_after_forward(), wbytes / 2) << "second use kept its copy";
  const size_t kept = held_after_forward();  // third use: kept from now on
  EXPECT_GE(kept, wbytes);
  EXPECT_EQ(held_after_forward(), 0u) << "a kept copy was made again";
  w.mark_written();  // the kept copy is stale: freed at the next use
  const size_t before = host.stats().current_bytes;
  { Tensor y = be->conv2d_forward(x, w, ConvParams{3, 3, 1, 1}); }
  EXPECT_LE(host.stats().current_bytes + kept, before + wbytes / 2);
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
