// Conv2d on the CPU backend: forward, input and weight gradients against a float64 reference in
// every layout, then central finite differences; and a check of the tests' own layout helper.
// Inputs are fresh Philox draws (never zeros); outputs and gradients are NaN-poisoned first.
#include "layer_test_util.h"

using namespace spotrain;

namespace {

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
// Conv2d: forward, dx, dw against the float64 reference, then finite differences.
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
  expect_input_grad_as_finite_diffs(loss, xt, dx, 8, 43);
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

}  // namespace
