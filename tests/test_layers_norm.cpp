// BatchNorm2d on the CPU backend: training forward, running statistics, evaluation and backward
// against a float64 reference, and finite differences, with and without the fused ReLU.
// Inputs are fresh Philox draws (never zeros); outputs and gradients are NaN-poisoned first.
#include "layer_test_util.h"

using namespace spotrain;

namespace {

// ============================================================================================
// BatchNorm2d: training forward, running statistics, eval, backward, finite differences.
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

// `dx`, bn's backward of `dy` after a training forward on `x`, and the gradients it left on gamma
// and beta equal the float64 reference's within 1e-4.
void expect_backward_as_float64(Backend& be, BatchNorm2d& bn, const Tensor& dx, const BnSetup& s,
                                const Floats& x, const Floats& dy, const Floats& gamma,
                                const Floats& beta, bool relu) {
  Vec rdx, rdg, rdb;
  bn_bwd_ref(to_vec(x), to_vec(dy), s.N, s.C, s.hw(), to_vec(gamma), to_vec(beta), 1e-5, relu, rdx,
             rdg, rdb);
  EXPECT_TRUE(close(values(be, dx), rdx, 1e-4)) << "dx";
  EXPECT_TRUE(close(to_vec(bn.gamma().grad), rdg, 1e-4)) << "dgamma";
  EXPECT_TRUE(close(to_vec(bn.beta().grad), rdb, 1e-4)) << "dbeta";
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
  expect_backward_as_float64(*be, bn, dx, s, x, r, gamma, beta, relu);
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
  expect_backward_as_float64(*be, bn, dx, s, x, r, gamma, beta, relu);
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
  Context replay{*be, true};
  replay.as_replay();
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
  expect_input_grad_as_finite_diffs(loss, xt, dx, 8, 94);
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

}  // namespace
