// The float64 reference (kernels/reference/) against what it must compute: small cases worked
// out by hand for the forward formulas (convolution, batch norm, pooling, Linear, the loss, the
// optimizer steps, the roundings of the casts), the backward ops against the forward's adjoint
// (linear ops) or finite differences in double (batch norm, with ReLU, with Add + ReLU, the
// fused conv + batch-norm backward, the loss), and the fused ops against their compositions.
// Everything the op suite holds the backends against rests on these.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/reference/reference_backend.h"

using namespace spotrain;

namespace {

using Floats = std::vector<float>;

// A host NHWC tensor of the logical shape (N, C, H, W) from its values listed in NCHW order.
Tensor nhwc(const Shape& s, const Floats& nchw) {
  Tensor t = Tensor::host(s, DType::f32, Layout::nhwc);
  const int64_t N = s[0], C = s[1], H = s[2], W = s[3];
  EXPECT_EQ(int64_t(nchw.size()), N * C * H * W);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x)
          t.data<float>()[((n * H + y) * W + x) * C + c] = nchw[size_t(((n * C + c) * H + y) * W + x)];
  return t;
}
Tensor plain(const Shape& s, const Floats& v) {
  Tensor t = Tensor::host(s);
  EXPECT_EQ(int64_t(v.size()), t.numel());
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}
// A tensor's values in canonical order (4-D: NCHW).
Floats values(Backend& be, const Tensor& t) {
  Tensor h = be.to_host(t);
  return Floats(h.data<float>(), h.data<float>() + h.numel());
}
double dot(const Floats& a, const Floats& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}
// Values on a grid of 2^-10 (so that x +- 2^-7 is exact in fp32), from a fixed sequence.
Floats grid(int64_t n, int seed, double scale = 1) {
  Floats v(static_cast<size_t>(n));
  uint32_t s = uint32_t(seed) * 2654435761u + 12345u;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = float(std::round((double(s >> 8) / double(1 << 24) * 2 - 1) * scale * 1024) / 1024);
  }
  return v;
}
// Per channel of (N, C, H, W), the values +-(0.5 + 0.25 j) in a shuffled order: mean exactly 0,
// and none near zero, so a ReLU after a batch norm with beta 0 keeps its mask under the small
// moves of a finite difference.
Floats symmetric(const Shape& s) {
  const int64_t N = s[0], C = s[1], HW = s[2] * s[3], M = N * HW;
  Floats v(size_t(N * C * HW));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t k = 0; k < M; ++k) {
      const int64_t j = (k * 7 + c * 3) % M;  // a permutation of 0..M-1 (M not a multiple of 7)
      const float a = 0.5f + 0.25f * float(j / 2) + 0.125f * float(c);
      const int64_t n = k / HW, p = k % HW;
      v[size_t((n * C + c) * HW + p)] = (j % 2 ? -a : a);
    }
  return v;
}

// The gradient of f at x by central differences of step h, coordinate by coordinate.
Floats finite_differences(Floats x, const std::function<double(const Floats&)>& f, float h = 1.f / 128) {
  Floats g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float keep = x[i];
    x[i] = keep + h;
    const double up = f(x);
    x[i] = keep - h;
    const double down = f(x);
    x[i] = keep;
    g[i] = float((up - down) / (2 * double(h)));
  }
  return g;
}
double nerr(const Floats& got, const Floats& want) {
  double d = 0, w = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    d += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    w += double(want[i]) * want[i];
  }
  return got.size() == want.size() ? std::sqrt(d / std::max(w, 1e-300)) : INFINITY;
}

class ReferenceOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> ref = make_reference_backend();
  Tensor act(const Shape& s, const Floats& nchw_values) { return ref->upload_images(nhwc(s, nchw_values)); }
  Tensor vec(const Shape& s, const Floats& v) { return ref->from_host(plain(s, v)); }
};

// ---- convolution -------------------------------------------------------------------------------

// y[n,k,oy,ox] = sum_c,i,j x[n,c,oy*s-pad+i,ox*s-pad+j] w[k,c,i,j], worked out by hand: an
// asymmetric 2x2 filter (a flipped or transposed one gives other numbers), a padded strided
// window, and two channels into two filters (their order).
TEST_F(ReferenceOps, ConvolutionForwardByHand) {
  const Tensor x = act({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  EXPECT_EQ(values(*ref, ref->conv2d_forward(x, vec({1, 1, 2, 2}, {1, 2, 3, 4}), ConvParams{2, 2, 1, 0})),
            (Floats{37, 47, 67, 77}));
  EXPECT_EQ(values(*ref, ref->conv2d_forward(x, vec({1, 1, 3, 3}, Floats(9, 1.f)), ConvParams{3, 3, 2, 1})),
            (Floats{12, 16, 24, 28}));
  const Tensor two = act({1, 2, 1, 2}, {1, 2, 10, 20});  // channel 0: 1, 2; channel 1: 10, 20
  EXPECT_EQ(values(*ref, ref->conv2d_forward(two, vec({2, 2, 1, 1}, {1, 2, 3, 4}), ConvParams{1, 1, 1, 0})),
            (Floats{21, 42, 43, 86}));  // filter 0: x0 + 2 x1; filter 1: 3 x0 + 4 x1
}

// Both gradients are the forward's adjoint: <conv(x, w), dy> = <x, dL/dx> = <w, dL/dw>, at the
// strides and paddings ResNets use.
TEST_F(ReferenceOps, ConvolutionGradientsAreTheForwardsAdjoint) {
  struct Case {
    Shape x;
    int k, stride, pad, out;
  };
  for (const Case& c : {Case{{2, 3, 9, 9}, 3, 1, 1, 4}, Case{{2, 3, 9, 8}, 3, 2, 1, 5},
                        Case{{1, 2, 11, 11}, 7, 2, 3, 3}, Case{{2, 4, 5, 5}, 1, 2, 0, 3}}) {
    SCOPED_TRACE(shape_str(c.x) + " k" + std::to_string(c.k) + " s" + std::to_string(c.stride));
    const ConvParams p{c.k, c.k, c.stride, c.pad};
    const Shape ws{c.out, c.x[1], c.k, c.k};
    const Floats hx = grid(shape_numel(c.x), 1), hw = grid(shape_numel(ws), 2);
    const Tensor x = act(c.x, hx), w = vec(ws, hw);
    const Tensor y = ref->conv2d_forward(x, w, p);
    const Floats hdy = grid(y.numel(), 3);
    const Tensor dy = act(y.shape(), hdy);
    const double want = dot(values(*ref, y), hdy);
    EXPECT_NEAR(dot(hx, values(*ref, ref->conv2d_backward_data(dy, w, x, p))), want, 1e-5 * std::fabs(want) + 1e-5);
    Tensor dw = ref->zeros(ws);
    ref->conv2d_backward_weights(x, dy, p, dw);
    EXPECT_NEAR(dot(hw, values(*ref, dw)), want, 1e-5 * std::fabs(want) + 1e-5);
  }
}

// The fused forms are their compositions: acc + the data gradient; the convolution of
// relu(batchnorm(x)) with the given statistics, with the batch statistics of its output.
TEST_F(ReferenceOps, FusedConvolutionFormsAreTheirCompositions) {
  const Shape s{2, 3, 5, 5};
  const ConvParams p{3, 3, 1, 1};
  const Tensor x = act(s, grid(shape_numel(s), 4, 2)), w = vec({4, 3, 3, 3}, grid(108, 5, 0.3));
  const Tensor dy = act({2, 4, 5, 5}, grid(200, 6));
  Tensor acc = act(s, grid(shape_numel(s), 7));
  const Floats acc0 = values(*ref, acc), dx = values(*ref, ref->conv2d_backward_data(dy, w, x, p));
  ref->conv2d_backward_data_add(dy, w, x, p, acc);
  const Floats sum = values(*ref, acc);
  for (size_t i = 0; i < sum.size(); ++i) EXPECT_NEAR(sum[i], acc0[i] + dx[i], 1e-6 * (1 + std::fabs(sum[i])));

  const Tensor gamma = vec({3}, {1.25f, 0.5f, 2.f}), beta = vec({3}, {0.25f, -0.5f, 0.f});
  const Tensor mean = vec({3}, {0.1f, -0.2f, 0.3f}), var = vec({3}, {1.5f, 0.75f, 2.f});
  const BnApply pro{gamma, beta, mean, var, 1e-5f};
  BnSaved stats;
  const Tensor fused = ref->conv2d_forward_bn_stats(x, w, p, &pro, 1e-5f, &stats);
  const Tensor in = ref->batchnorm_forward_infer(x, gamma, beta, mean, var, 1e-5f, true);
  const Tensor apart = ref->conv2d_forward(in, w, p);
  EXPECT_LT(nerr(values(*ref, fused), values(*ref, apart)), 1e-6);
  Tensor one = vec({4}, Floats(4, 1.f)), zero = vec({4}, Floats(4, 0.f));
  BnSaved direct;
  ref->batchnorm_forward_train(apart, one, zero, 1e-5f, false, direct);
  EXPECT_LT(nerr(values(*ref, stats.mean), values(*ref, direct.mean)), 1e-6);
  EXPECT_LT(nerr(values(*ref, stats.var), values(*ref, direct.var)), 1e-6);
}

// ---- batch norm --------------------------------------------------------------------------------

// One channel of 1, 2, 3, 4: mean 2.5, biased variance 1.25; y = 2 (x - 2.5) / sqrt(1.25) + 1;
// the running statistics (momentum 0.1, the variance made unbiased: 1.25 * 4 / 3) and inference.
TEST_F(ReferenceOps, BatchNormByHand) {
  const Tensor x = act({1, 1, 2, 2}, {1, 2, 3, 4});
  const Tensor gamma = vec({1}, {2}), beta = vec({1}, {1});
  BnSaved saved;
  const Floats y = values(*ref, ref->batchnorm_forward_train(x, gamma, beta, 0.f, false, saved));
  EXPECT_FLOAT_EQ(values(*ref, saved.mean)[0], 2.5f);
  EXPECT_FLOAT_EQ(values(*ref, saved.var)[0], 1.25f);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(y[size_t(i)], float(2 * (i + 1 - 2.5) / std::sqrt(1.25) + 1)) << i;
  const Floats yr = values(*ref, ref->batchnorm_forward_train(x, gamma, beta, 0.f, true, saved));
  EXPECT_EQ(yr[0], 0.f);  // 2 (-1.5) / 1.118 + 1 < 0
  EXPECT_FLOAT_EQ(yr[3], y[3]);
  Tensor rm = vec({1}, {0}), rv = vec({1}, {1});
  ref->batchnorm_update_running(rm, rv, saved, 0.1f, 4);
  EXPECT_FLOAT_EQ(values(*ref, rm)[0], 0.25f);
  EXPECT_FLOAT_EQ(values(*ref, rv)[0], float(0.9 + 0.1 * 1.25 * 4 / 3));
  const Floats inf = values(*ref, ref->batchnorm_forward_infer(x, gamma, beta, rm, rv, 0.f, false));
  EXPECT_FLOAT_EQ(inf[0], float(2 * (1 - 0.25) / std::sqrt(0.9 + 0.1 * 1.25 * 4 / 3) + 1));
}

// dx, dgamma and dbeta of L = <batchnorm(x) (then ReLU), r> against central differences of L,
// which the forward computes in double (rounded once to fp32 per output).
TEST_F(ReferenceOps, BatchNormGradientsMatchFiniteDifferences) {
  const Shape s{2, 3, 2, 3};
  const int64_t C = s[1];
  const Floats hx = symmetric(s), hr = grid(shape_numel(s), 8), hg = {1.25f, 0.75f, 1.5f}, hb = {0, 0, 0};
  for (bool relu : {false, true}) {
    SCOPED_TRACE(relu ? "relu" : "plain");
    auto loss = [&](const Floats& x, const Floats& g, const Floats& b) {
      BnSaved sv;
      return dot(values(*ref, ref->batchnorm_forward_train(act(s, x), vec({C}, g), vec({C}, b), 1e-5f, relu, sv)), hr);
    };
    BnSaved saved;
    const Tensor x = act(s, hx), gamma = vec({C}, hg), beta = vec({C}, hb);
    ref->batchnorm_forward_train(x, gamma, beta, 1e-5f, relu, saved);
    Tensor dgamma = ref->zeros({C}), dbeta = ref->zeros({C});
    const Floats dx =
        values(*ref, ref->batchnorm_backward(act(s, hr), x, gamma, beta, saved, 1e-5f, relu, dgamma, dbeta));
    EXPECT_LT(nerr(dx, finite_differences(hx, [&](const Floats& v) { return loss(v, hg, hb); })), 1e-3);
    EXPECT_LT(nerr(values(*ref, dgamma), finite_differences(hg, [&](const Floats& v) { return loss(hx, v, hb); })), 1e-4);
    EXPECT_LT(nerr(values(*ref, dbeta), finite_differences(hb, [&](const Floats& v) { return loss(hx, hg, v); })), 1e-4);
  }
}

// relu(batchnorm(x) + z): dx, dz, dgamma, dbeta against central differences (z at +-8, beyond
// what gamma * batchnorm(x) + beta reaches over 12 values, so that no sum lies near zero).
TEST_F(ReferenceOps, BatchNormAddReluGradientsMatchFiniteDifferences) {
  const Shape s{2, 2, 3, 2};
  const int64_t C = s[1];
  Floats hz = grid(shape_numel(s), 9);
  for (float& v : hz) v = v < 0 ? -8.f + v / 4 : 8.f + v / 4;
  const Floats hx = grid(shape_numel(s), 10, 3), hr = grid(shape_numel(s), 11), hg = {1.5f, 0.5f}, hb = {0.25f, -0.25f};
  auto loss = [&](const Floats& x, const Floats& z, const Floats& g, const Floats& b) {
    BnSaved sv;
    return dot(values(*ref, ref->batchnorm_add_relu_forward_train(act(s, x), act(s, z), vec({C}, g), vec({C}, b),
                                                                  1e-5f, sv)),
               hr);
  };
  BnSaved saved;
  const Tensor x = act(s, hx), gamma = vec({C}, hg), beta = vec({C}, hb);
  ref->batchnorm_add_relu_forward_train(x, act(s, hz), gamma, beta, 1e-5f, saved);
  Tensor dgamma = ref->zeros({C}), dbeta = ref->zeros({C}), dz;
  const Floats dx =
      values(*ref, ref->batchnorm_add_relu_backward(act(s, hr), x, gamma, beta, saved, 1e-5f, dgamma, dbeta, dz));
  EXPECT_FALSE(saved.backend_state[BnSaved::kComposedOutput].defined()) << "the saved output is consumed";
  EXPECT_LT(nerr(dx, finite_differences(hx, [&](const Floats& v) { return loss(v, hz, hg, hb); })), 1e-3);
  EXPECT_LT(nerr(values(*ref, dz), finite_differences(hz, [&](const Floats& v) { return loss(hx, v, hg, hb); })), 1e-4);
  EXPECT_LT(nerr(values(*ref, dgamma), finite_differences(hg, [&](const Floats& v) { return loss(hx, hz, v, hb); })), 1e-4);
  EXPECT_LT(nerr(values(*ref, dbeta), finite_differences(hb, [&](const Floats& v) { return loss(hx, hz, hg, v); })), 1e-4);
}

// conv2d_backward_bn_relu is the gradient of L = <conv(relu(batchnorm(x)), w), r>, the batch
// norm on x's own batch statistics: dx, dw, dgamma and dbeta against central differences.
TEST_F(ReferenceOps, FusedConvolutionBackwardMatchesFiniteDifferences) {
  const Shape s{2, 2, 3, 3};
  const int64_t C = s[1], K = 3;
  const ConvParams p{3, 3, 2, 1};
  const Shape ws{K, C, 3, 3};
  const Floats hx = symmetric(s), hw = grid(shape_numel(ws), 12, 0.5), hg = {1.25f, 0.75f}, hb = {0, 0};
  auto loss = [&](const Floats& x, const Floats& w, const Floats& g, const Floats& b) {
    BnSaved sv;
    const Tensor a = ref->batchnorm_forward_train(act(s, x), vec({C}, g), vec({C}, b), 1e-5f, true, sv);
    const Tensor y = ref->conv2d_forward(a, vec(ws, w), p);
    return dot(values(*ref, y), grid(y.numel(), 13));
  };
  const Tensor x = act(s, hx), w = vec(ws, hw), gamma = vec({C}, hg), beta = vec({C}, hb);
  BnSaved saved;
  ref->batchnorm_forward_train(x, gamma, beta, 1e-5f, false, saved);
  const BnApply pro{gamma, beta, saved.mean, saved.var, 1e-5f};
  const Tensor y = ref->conv2d_forward_bn_stats(x, w, p, &pro, 1e-5f, nullptr);
  Tensor dw = ref->zeros(ws), dgamma = ref->zeros({C}), dbeta = ref->zeros({C});
  const Floats dx = values(*ref, ref->conv2d_backward_bn_relu(act(y.shape(), grid(y.numel(), 13)), w, x, p, pro,
                                                              saved, dw, dgamma, dbeta));
  EXPECT_LT(nerr(dx, finite_differences(hx, [&](const Floats& v) { return loss(v, hw, hg, hb); })), 1e-3);
  EXPECT_LT(nerr(values(*ref, dw), finite_differences(hw, [&](const Floats& v) { return loss(hx, v, hg, hb); })), 1e-4);
  EXPECT_LT(nerr(values(*ref, dgamma), finite_differences(hg, [&](const Floats& v) { return loss(hx, hw, v, hb); })), 1e-4);
  EXPECT_LT(nerr(values(*ref, dbeta), finite_differences(hb, [&](const Floats& v) { return loss(hx, hw, hg, v); })), 1e-4);
}

// ---- pooling, Linear ---------------------------------------------------------------------------

// 3x3 windows, stride 2, padding 1 over a 4x4 plane: each output the largest of its window,
// and backward sends each output's gradient to where its maximum lay (shared maxima add up).
TEST_F(ReferenceOps, PoolingByHand) {
  const Tensor x = act({1, 1, 4, 4}, {1, 5, 2, 0,  //
                                      3, 4, 9, 1,  //
                                      0, 2, 6, 8,  //
                                      7, 1, 3, 2});
  const PoolParams p{3, 2, 1};
  Tensor ws;
  const Tensor y = ref->maxpool_forward(x, p, ws);
  EXPECT_EQ(values(*ref, y), (Floats{5, 9, 7, 9}));
  const Floats dx = values(*ref, ref->maxpool_backward(act({1, 1, 2, 2}, {1, 10, 100, 1000}), x, ws, p));
  EXPECT_EQ(dx, (Floats{0, 1, 0, 0, 0, 0, 1010, 0, 0, 0, 0, 0, 100, 0, 0, 0}));
  EXPECT_EQ(values(*ref, ref->global_avgpool_forward(x)), (Floats{54.f / 16}));
  EXPECT_EQ(values(*ref, ref->global_avgpool_backward(vec({1, 1}, {8}), x)), Floats(16, 0.5f));
}

// y = x w^T + b by hand; dx, dw, db as the forward's adjoint and sum.
TEST_F(ReferenceOps, LinearByHand) {
  const Tensor x = vec({2, 3}, {1, 2, 3, 4, 5, 6}), w = vec({2, 3}, {1, 0, -1, 2, 1, 0}), b = vec({2}, {10, 20});
  EXPECT_EQ(values(*ref, ref->linear_forward(x, w, b)), (Floats{8, 24, 8, 33}));
  Tensor dw = ref->zeros({2, 3}), db = ref->zeros({2});
  const Tensor dx = ref->linear_backward(vec({2, 2}, {1, 2, 3, 4}), x, w, dw, db, true);
  EXPECT_EQ(values(*ref, dx), (Floats{5, 2, -1, 11, 4, -3}));   // dy w
  EXPECT_EQ(values(*ref, dw), (Floats{13, 17, 21, 18, 24, 30}));  // dy^T x
  EXPECT_EQ(values(*ref, db), (Floats{4, 6}));
  EXPECT_FALSE(ref->linear_backward(vec({2, 2}, {1, 2, 3, 4}), x, w, dw, db, false).defined());
}

// ---- the loss ----------------------------------------------------------------------------------

// Logits (ln 3, 0): softmax (0.75, 0.25). Label 0 with smoothing 0.2 targets (0.9, 0.1): loss
// 0.9 ln(4/3) + 0.1 ln 4, gradient (p - q) * grad_scale / N. With label 1 mixed in at 3/4 the
// targets are (0.3, 0.7).
TEST_F(ReferenceOps, SoftmaxCrossEntropyByHand) {
  const Tensor z = vec({1, 2}, {float(std::log(3.0)), 0.f});
  const int32_t label = 0, other = 1;
  Tensor dz;
  LossResult l = ref->softmax_xent(z, &label, 0.2f, 2.f, &dz);
  EXPECT_NEAR(l.loss, 0.9 * std::log(4.0 / 3) + 0.1 * std::log(4.0), 1e-7);
  EXPECT_EQ(l.top1, 1);
  EXPECT_EQ(l.top5, 1);
  const Floats g = values(*ref, dz);
  EXPECT_NEAR(g[0], -0.3, 1e-6);
  EXPECT_NEAR(g[1], 0.3, 1e-6);
  const float lam = 0.25f;
  const LabelMix mix{&other, &lam};
  l = ref->softmax_xent(z, &label, 0.2f, 1.f, nullptr, &mix);
  EXPECT_NEAR(l.loss, 0.3 * std::log(4.0 / 3) + 0.7 * std::log(4.0), 1e-7);
  // A NaN logit ranks above the label: the row is wrong.
  const Tensor bad = vec({1, 3}, {5.f, std::numeric_limits<float>::quiet_NaN(), 0.f});
  l = ref->softmax_xent(bad, &label, 0.f, 1.f, nullptr);
  EXPECT_EQ(l.top1, 0);
  EXPECT_EQ(l.top5, 1);
}

// The gradient is that of loss * grad_scale (the loss a double, not rounded): central
// differences over every logit, with smoothing and mixed targets.
TEST_F(ReferenceOps, SoftmaxCrossEntropyGradientMatchesFiniteDifferences) {
  const int64_t n = 3, m = 5;
  const Floats hz = grid(n * m, 14, 3);
  const std::vector<int32_t> labels = {0, 3, 4}, others = {2, 3, 1};
  const std::vector<float> lam = {0.25f, 0.5f, 1.f};
  const LabelMix mix{others.data(), lam.data()};
  Tensor dz;
  ref->softmax_xent(vec({n, m}, hz), labels.data(), 0.1f, 4.f, &dz, &mix);
  const Floats fd = finite_differences(hz, [&](const Floats& z) {
    return 4.0 * ref->softmax_xent(vec({n, m}, z), labels.data(), 0.1f, 4.f, nullptr, &mix).loss;
  });
  EXPECT_LT(nerr(values(*ref, dz), fd), 1e-4);
}

// ---- casts and uploads -------------------------------------------------------------------------

// Round to nearest, ties to even; fp16 overflows to inf past 65504 (65520 and up), keeps its
// subnormals (2^-24 the least; half of it ties to 0, three quarters of it rounds up to 2^-24),
// and NaN stays NaN.
TEST_F(ReferenceOps, CastsRoundToNearestEvenByHand) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto round_trip = [&](DType to, const Floats& v) {
    return values(*ref, ref->cast(ref->cast(vec({int64_t(v.size())}, v), to), DType::f32));
  };
  const float one = 1.f;
  const Floats b = round_trip(DType::bf16, {one + std::ldexp(1.f, -8), one + 3 * std::ldexp(1.f, -8),
                                            one + std::ldexp(1.f, -9), -3.f, 3.4e38f});
  EXPECT_EQ(b[0], 1.f);                           // a tie, to the even 1
  EXPECT_EQ(b[1], one + std::ldexp(1.f, -6));     // a tie, to the even 1 + 2^-6
  EXPECT_EQ(b[2], 1.f);                           // below half a step
  EXPECT_EQ(b[3], -3.f);
  EXPECT_EQ(b[4], inf);                           // past halfway above bf16's largest, 3.3895e38
  const Floats h = round_trip(DType::f16, {65519.f, 65520.f, std::ldexp(1.f, -24), std::ldexp(1.f, -25),
                                           3 * std::ldexp(1.f, -26), -0.f, nan, 2049.f, 2051.f});
  EXPECT_EQ(h[0], 65504.f);
  EXPECT_EQ(h[1], inf);
  EXPECT_EQ(h[2], std::ldexp(1.f, -24));
  EXPECT_EQ(h[3], 0.f);
  EXPECT_EQ(h[4], std::ldexp(1.f, -24));
  EXPECT_TRUE(h[5] == 0.f && std::signbit(h[5]));
  EXPECT_TRUE(std::isnan(h[6]));
  EXPECT_EQ(h[7], 2048.f);  // 2049: a tie between 2048 and 2050, to the even 2048
  EXPECT_EQ(h[8], 2052.f);  // 2051: a tie between 2050 and 2052, to the even 2052
}

// Uploads keep NHWC and to_host gives NCHW; 8-bit pixels are (pixel / 255 - mean) / std.
TEST_F(ReferenceOps, UploadsKeepTheCanonicalOrder) {
  const Tensor x = ref->upload_images(nhwc({1, 2, 1, 2}, {1, 2, 3, 4}), DType::bf16);
  EXPECT_EQ(x.layout(), Layout::nhwc);
  EXPECT_EQ(x.dtype(), DType::bf16);
  EXPECT_EQ(values(*ref, x), (Floats{1, 2, 3, 4}));
  Tensor px = Tensor::host({1, 2, 1, 1}, DType::u8, Layout::nhwc);
  static_cast<uint8_t*>(px.write_raw())[0] = 255;
  static_cast<uint8_t*>(px.write_raw())[1] = 51;
  PixelNorm norm;
  norm.mean[0] = 0.5f, norm.std[0] = 0.25f, norm.mean[1] = 0.f, norm.std[1] = 0.5f;
  const Floats v = values(*ref, ref->upload_pixels(px, norm, DType::f32));
  EXPECT_NEAR(v[0], 2.0, 1e-6);
  EXPECT_NEAR(v[1], 0.4, 1e-6);
}

// ---- the optimizer and the elementwise steps ---------------------------------------------------

// SGD: g = 2 * 0.5 + 0.01 * 1 = 1.01; m = 0.9 * 0.5 + 1.01 = 1.46; p = 1 - 0.1 m = 0.854, or
// with Nesterov 1 - 0.1 (g + 0.9 m) = 0.7676. LARS on w = (3, 4), g = (0, 1): trust
// 0.001 * 5 / 1, v = 2 * 0.005 * g, w - v.
TEST_F(ReferenceOps, OptimizerStepsByHand) {
  for (bool nesterov : {false, true}) {
    Tensor p = vec({1}, {1}), g = vec({1}, {2}), m = vec({1}, {0.5f});
    ref->sgd_step(p, g, m, {SgdSegment{0, 1, 0.01f}}, SgdHyper{0.1f, 0.9f, nesterov, 0.5f});
    EXPECT_NEAR(values(*ref, m)[0], 1.46, 1e-6);
    EXPECT_NEAR(values(*ref, p)[0], nesterov ? 0.7676 : 0.854, 1e-6);
  }
  Tensor w = vec({3}, {3, 4, 1}), g = vec({3}, {0, 1, 1}), v = vec({3}, {0, 0, 0});
  LarsHyper h;
  h.lr = 2.f;
  h.momentum = 0.9f;
  h.trust = 0.001f;
  h.epsilon = 0.f;
  ref->lars_step(w, g, v, {LarsSegment{0, 2, 0.f, true}, LarsSegment{2, 1, 0.f, false}}, h);
  const Floats wv = values(*ref, w), vv = values(*ref, v);
  EXPECT_NEAR(vv[1], 0.01, 1e-8);
  EXPECT_FLOAT_EQ(wv[0], 3.f);
  EXPECT_NEAR(wv[1], 3.99, 1e-6);
  EXPECT_NEAR(wv[2], -1.f, 1e-6);  // left out of the adaptation: trust 1, 1 - 2 * 1
}

TEST_F(ReferenceOps, UnscaleLerpReluAndAddByHand) {
  Tensor g = vec({3}, {1, -2, 1e30f});
  EXPECT_FALSE(ref->unscale_and_check(g, 0.5f));
  EXPECT_EQ(values(*ref, g), (Floats{0.5f, -1.f, 0.5e30f}));
  EXPECT_TRUE(ref->unscale_and_check(g, 1e10f)) << "the product overflows fp32";
  Tensor d = vec({2}, {1, 2});
  ref->lerp(d, vec({2}, {3, 0}), 0.25f);
  EXPECT_EQ(values(*ref, d), (Floats{1.5f, 1.5f}));
  const Tensor a = act({1, 1, 1, 3}, {-1, 0.5f, 2}), b = act({1, 1, 1, 3}, {0.5f, -1, 1});
  EXPECT_EQ(values(*ref, ref->relu_forward(a)), (Floats{0, 0.5f, 2}));
  const Tensor s = ref->add_forward(a, b, true);
  EXPECT_EQ(values(*ref, s), (Floats{0, 0, 3}));
  const Tensor dy = act({1, 1, 1, 3}, {7, 8, 9});
  EXPECT_EQ(values(*ref, ref->add_backward(dy, s, true)), (Floats{0, 0, 9}));
  EXPECT_EQ(values(*ref, ref->relu_backward(dy, ref->relu_forward(a))), (Floats{0, 8, 9}));
}

// The reference compares fp32 values only: a 16-bit or blocked activation is an error (the op
// suite hands it the same values rounded, in fp32), never a silent conversion.
TEST_F(ReferenceOps, RefusesWhatItDoesNotCompute) {
  const Tensor x16 = ref->upload_images(nhwc({1, 1, 2, 2}, {1, 2, 3, 4}), DType::f16);
  EXPECT_THROW(ref->relu_forward(x16), Error);
  EXPECT_THROW(ref->conv2d_forward(x16, vec({1, 1, 1, 1}, {1}), ConvParams{1, 1, 1, 0}), Error);
  Tensor blocked({1, 16, 1, 1}, DType::f32, Allocator::host(), Layout::blocked);
  EXPECT_THROW(ref->to_host(blocked), Error);
}

}  // namespace
