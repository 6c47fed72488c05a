// Softmax cross-entropy on the CPU backend: loss and gradient against a float64 reference with
// label smoothing and a gradient scale, and top-1 / top-5 counts on constructed logits.
// Inputs are fresh Philox draws (never zeros); outputs and gradients are NaN-poisoned first.
#include "layer_test_util.h"

using namespace spotrain;

namespace {

// ============================================================================================
// Softmax cross-entropy.
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

}  // namespace
