// ReLU, MaxPool2d, GlobalAvgPool and Linear on the CPU backend: against float64 references
// and finite differences.
// Inputs are fresh Philox draws (never zeros); outputs and gradients are NaN-poisoned first.
#include "layer_test_util.h"

using namespace spotrain;

namespace {

// ============================================================================================
// ReLU, MaxPool2d, GlobalAvgPool, Linear.
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
  expect_input_grad_as_finite_diffs(loss, xt, got, 8, 102);
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
  expect_input_grad_as_finite_diffs(loss, xt, got, 10, 112);
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
  expect_input_grad_as_finite_diffs(loss, xt, got, 6, 122);
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

}  // namespace
