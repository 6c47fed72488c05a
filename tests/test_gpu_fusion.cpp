// cuDNN's graph API on a GPU (kernels/cuda/cudnn_graph.h): the convolution whose epilogue
// also writes the per-channel sum and sum of squares of its output (with and without the
// scale-bias-ReLU prologue on its input), against the convolution and the statistics
// computed on the host from the same rounded inputs, for ResNet-50-like shapes at fp16 and
// bf16. A shape cuDNN refuses is skipped with its reason (the point of the
// test on a new GPU or cuDNN is to learn which). The backward graphs (weight gradient with the
// prologue; data gradient with the ReLU backward and the batch-norm weight gradients) are
// checked through the backend's op in the op suite,
// BackendOps.ConvolutionWithBatchNormStatisticsAndPrologue (test_backend_ops.cpp).
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/philox.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cudnn_graph.h"
#include "kernels/cuda/cuda_util.h"
#include "core/tensor.h"
#include "kernels/ops.h"

namespace spotrain::cuda {
namespace {

struct Case {
  const char* name;
  ConvShape shape;
  bool prologue = false;  // relu(x * scale + bias) as the convolution's input
};

std::vector<Case> cases() {
  return {
      {"f16_3x3", {DType::f16, 4, 64, 28, 28, 64, 3, 3, 1, 1}},
      {"f16_1x1_expand", {DType::f16, 4, 64, 28, 28, 256, 1, 1, 1, 0}},
      {"f16_3x3_stride2", {DType::f16, 4, 128, 28, 28, 128, 3, 3, 2, 1}},
      {"f16_1x1_reduce", {DType::f16, 4, 256, 14, 14, 64, 1, 1, 1, 0}},
      // cuDNN documents GenStats for fp16 only: a refusal skips with its reason.
      {"bf16_1x1_reduce", {DType::bf16, 4, 256, 14, 14, 64, 1, 1, 1, 0}},
      {"f16_bn_relu_3x3", {DType::f16, 4, 64, 28, 28, 64, 3, 3, 1, 1}, true},
      {"f16_bn_relu_1x1_expand", {DType::f16, 4, 64, 28, 28, 256, 1, 1, 1, 0}, true},
      {"f16_bn_relu_3x3_stride2", {DType::f16, 4, 128, 28, 28, 128, 3, 3, 2, 1}, true},
  };
}

// How gtest (and so the CTest test list) prints a parameter: its name, not its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ConvStats : public ::testing::TestWithParam<Case> {};

// Rounds `v` to the shape's 16-bit type, stores the bits, returns the rounded value.
float round_into(DType dt, float v, uint16_t* bits) {
  *bits = dt == DType::f16 ? float_to_half(v) : float_to_bf16(v);
  return dt == DType::f16 ? half_to_float(*bits) : bf16_to_float(*bits);
}

// A cuDNN handle that outlives the graph planned on it (declared before it).
struct Handle {
  cudnnHandle_t h = nullptr;
  Handle() { CUDNN_CHECK(cudnnCreate(&h)); }
  ~Handle() { cudnnDestroy(h); }
};

struct DeviceBuf {
  void* p = nullptr;
  explicit DeviceBuf(size_t bytes) { CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1)); }
  ~DeviceBuf() { cudaFree(p); }
};

TEST_P(ConvStats, OutputAndStatisticsMatchTheUnfusedComputation) {
  if (!cuda_backend_ready()) GTEST_SKIP() << "no CUDA device";
  const ConvShape s = GetParam().shape;
  const int64_t P = s.p(), Q = s.q();
  Handle handle;
  const bool pro = GetParam().prologue;
  ConvStatsGraph g(handle.h, s, pro);
  if (!g.accepted()) GTEST_SKIP() << "cuDNN refused the conv + statistics graph: " << g.refusal();

  // x NHWC, w KRSC: small integers-ish values keep the fp32 reference close.
  Philox rng(17, 3);
  std::vector<uint16_t> xb(size_t(s.n * s.h * s.w * s.c)), wb(size_t(s.k * s.r * s.s * s.c));
  std::vector<float> xf(xb.size()), wf(wb.size());
  for (size_t i = 0; i < xb.size(); ++i) xf[i] = round_into(s.dtype, rng.normal(), &xb[i]);
  for (size_t i = 0; i < wb.size(); ++i) wf[i] = round_into(s.dtype, 0.1f * rng.normal(), &wb[i]);
  // The prologue's per-channel scale and bias; what the convolution then reads is
  // relu(x * scale + bias), computed in fp32 (cuDNN's virtual tensors are fp32) and most
  // likely rounded to the 16-bit type for the tensor cores: the reference rounds too, and the
  // tolerance below allows for either.
  std::vector<uint16_t> sb(size_t(s.c)), bb(size_t(s.c));
  std::vector<float> sf(sb.size()), bf(bb.size());
  for (size_t i = 0; i < sb.size(); ++i) {
    sf[i] = round_into(s.dtype, 1.f + 0.3f * rng.normal(), &sb[i]);
    bf[i] = round_into(s.dtype, 0.3f * rng.normal(), &bb[i]);
  }
  if (pro)
    for (size_t i = 0; i < xf.size(); ++i) {
      const size_t c = i % size_t(s.c);
      uint16_t unused = 0;
      xf[i] = round_into(s.dtype, std::max(0.f, xf[i] * sf[c] + bf[c]), &unused);
    }
  const size_t ybytes = size_t(s.n * P * Q * s.k) * 2;
  DeviceBuf dx(xb.size() * 2), dw(wb.size() * 2), dy(ybytes), dsum(size_t(s.k) * 4),
      dsq(size_t(s.k) * 4), ws(g.workspace_bytes()), dscale(sb.size() * 2), dbias(bb.size() * 2);
  CUDA_CHECK(cudaMemcpy(dscale.p, sb.data(), sb.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dbias.p, bb.data(), bb.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dx.p, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dw.p, wb.data(), wb.size() * 2, cudaMemcpyHostToDevice));
  // The sums start as a sentinel, and the graph runs twice: they must be overwritten, not
  // added to.
  std::vector<float> sentinel(size_t(s.k), 7.f);
  CUDA_CHECK(cudaMemcpy(dsum.p, sentinel.data(), sentinel.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dsq.p, sentinel.data(), sentinel.size() * 4, cudaMemcpyHostToDevice));
  for (int run = 0; run < 2; ++run)
    g.run(dx.p, dw.p, dy.p, static_cast<float*>(dsum.p), static_cast<float*>(dsq.p), ws.p,
          pro ? dscale.p : nullptr, pro ? dbias.p : nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> yb(ybytes / 2);
  std::vector<float> sum(size_t(s.k)), sq(size_t(s.k));
  CUDA_CHECK(cudaMemcpy(yb.data(), dy.p, ybytes, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(sum.data(), dsum.p, sum.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(sq.data(), dsq.p, sq.size() * 4, cudaMemcpyDeviceToHost));

  // The host reference: the convolution in fp32 (double accumulation), then per channel the
  // sum and sum of squares of the device's own output (what a batch norm would read).
  // Outputs whose window reaches into the padding are counted apart: with the prologue the
  // reference pads after it (zeros, not relu(bias)), which no cuDNN document states.
  int64_t bad_y = 0, bad_border = 0;
  double worst = 0;
  std::vector<double> ref_sum(size_t(s.k), 0.0), ref_sq(size_t(s.k), 0.0), abs_sum(size_t(s.k), 0.0);
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q)
        for (int64_t k = 0; k < s.k; ++k) {
          double acc = 0;
          bool border = false;
          for (int64_t r = 0; r < s.r; ++r)
            for (int64_t t = 0; t < s.s; ++t) {
              const int64_t ih = p * s.stride - s.pad + r, iw = q * s.stride - s.pad + t;
              if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) {
                border = true;
                continue;
              }
              const float* xp = &xf[size_t(((n * s.h + ih) * s.w + iw) * s.c)];
              const float* wp = &wf[size_t(((k * s.r + r) * s.s + t) * s.c)];
              for (int64_t c = 0; c < s.c; ++c) acc += double(xp[c]) * wp[c];
            }
          const uint16_t bits = yb[size_t(((n * P + p) * Q + q) * s.k + k)];
          const double got = s.dtype == DType::f16 ? half_to_float(bits) : bf16_to_float(bits);
          const double tol =
              (s.dtype == DType::f16 ? (pro ? 6e-3 : 2e-3) : 1.6e-2) * (std::fabs(acc) + 1.0);
          worst = std::max(worst, std::fabs(got - acc));
          const bool bad = std::fabs(got - acc) > tol;
          (border ? bad_border : bad_y) += bad;
          ref_sum[size_t(k)] += got;
          ref_sq[size_t(k)] += got * got;
          abs_sum[size_t(k)] += std::fabs(got);
        }
  EXPECT_EQ(bad_y, 0) << "interior outputs away from the fp32 convolution; largest difference " << worst;
  EXPECT_EQ(bad_border, 0) << "outputs at the padded border away from the reference (padding "
                              "applied before the prologue?); largest difference " << worst;
  for (int64_t k = 0; k < s.k; ++k) {
    // The epilogue sums fp32 accumulators or the rounded outputs, in its own order: within
    // the rounding of the outputs summed.
    const double eps = s.dtype == DType::f16 ? 1e-3 : 8e-3;
    EXPECT_NEAR(sum[size_t(k)], ref_sum[size_t(k)], eps * abs_sum[size_t(k)] + 1e-3) << "sum of channel " << k;
    EXPECT_NEAR(sq[size_t(k)], ref_sq[size_t(k)], 2 * eps * ref_sq[size_t(k)] + 1e-3) << "sum of squares of channel " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ConvStats, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// Two layers fused the way the training path runs them (--fusion bn): conv1 with the
// statistics of its output, the batch-norm finalize (launch_bn_stats_from_sums,
// launch_bn_scale_bias, the scale and bias in the type the prologue graph took: fp32 for
// bf16), then conv2 reading relu(bn1(y1)) through its prologue, against the backend's own ops
// (conv2d_forward, batchnorm_forward_train with ReLU, conv2d_forward) on the same rounded
// inputs, in fp16 and in bf16.
void conv_bn_relu_conv_matches_the_backend_ops(DType dt) {
  const ConvShape s1{dt, 4, 64, 28, 28, 64, 3, 3, 1, 1};
  const ConvShape s2{dt, 4, 64, 28, 28, 256, 1, 1, 1, 0};
  Handle handle;
  ConvStatsGraph g1(handle.h, s1), g2(handle.h, s2, /*bn_relu_prologue=*/true);
  if (!g1.accepted()) GTEST_SKIP() << "cuDNN refused conv + statistics: " << g1.refusal();
  if (!g2.accepted()) GTEST_SKIP() << "cuDNN refused the prologue graph: " << g2.refusal();

  // Inputs rounded to fp16 on the host, so both paths start from the same values: x in NHWC,
  // the weights as fp32 OIHW for the backend and fp16 KRSC for the graphs.
  Philox rng(23, 5);
  auto rounded = [&](float v, uint16_t* bits) { return round_into(dt, v, bits); };
  Tensor hx = Tensor::host({s1.n, s1.c, s1.h, s1.w}, DType::f32, Layout::nhwc);
  std::vector<uint16_t> xb(size_t(hx.numel()));
  for (size_t i = 0; i < xb.size(); ++i) hx.data<float>()[i] = rounded(rng.normal(), &xb[i]);
  auto weights = [&](const ConvShape& s, Tensor* oihw, std::vector<uint16_t>* krsc) {
    *oihw = Tensor::host({s.k, s.c, s.r, s.s});
    krsc->assign(size_t(s.k * s.r * s.s * s.c), 0);
    const float scale = 1.f / std::sqrt(float(s.c * s.r * s.s));
    for (int64_t k = 0; k < s.k; ++k)
      for (int64_t c = 0; c < s.c; ++c)
        for (int64_t r = 0; r < s.r; ++r)
          for (int64_t t = 0; t < s.s; ++t)
            oihw->data<float>()[((k * s.c + c) * s.r + r) * s.s + t] =
                rounded(scale * rng.normal(), &(*krsc)[size_t(((k * s.r + r) * s.s + t) * s.c + c)]);
  };
  Tensor hw1, hw2;
  std::vector<uint16_t> w1b, w2b;
  weights(s1, &hw1, &w1b);
  weights(s2, &hw2, &w2b);
  std::vector<float> gamma(size_t(s1.k)), beta(size_t(s1.k));
  for (auto& g : gamma) g = 1.f + 0.2f * rng.normal();
  for (auto& b : beta) b = 0.3f * rng.normal();
  const float eps = 1e-5f;

  // The fused path.
  const int64_t m1 = s1.n * s1.p() * s1.q();
  DeviceBuf dx(xb.size() * 2), dw1(w1b.size() * 2), dw2(w2b.size() * 2),
      dy1(size_t(m1 * s1.k) * 2), dy2(size_t(s2.n * s2.p() * s2.q() * s2.k) * 2),
      dsum1(size_t(s1.k) * 4), dsq1(size_t(s1.k) * 4), dsum2(size_t(s2.k) * 4), dsq2(size_t(s2.k) * 4),
      dgamma(gamma.size() * 4), dbeta(beta.size() * 4), dmean(size_t(s1.k) * 4),
      dinvstd(size_t(s1.k) * 4), dvar(size_t(s1.k) * 4), dscale(size_t(s1.k) * 4), dbias(size_t(s1.k) * 4),
      ws(std::max(g1.workspace_bytes(), g2.workspace_bytes()));
  CUDA_CHECK(cudaMemcpy(dx.p, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dw1.p, w1b.data(), w1b.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dw2.p, w2b.data(), w2b.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dgamma.p, gamma.data(), gamma.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dbeta.p, beta.data(), beta.size() * 4, cudaMemcpyHostToDevice));
  g1.run(dx.p, dw1.p, dy1.p, static_cast<float*>(dsum1.p), static_cast<float*>(dsq1.p), ws.p);
  launch_bn_stats_from_sums(static_cast<float*>(dsum1.p), static_cast<float*>(dsq1.p), int(s1.k),
                            m1, eps, static_cast<float*>(dmean.p), static_cast<float*>(dvar.p),
                            static_cast<float*>(dinvstd.p), nullptr);
  launch_bn_scale_bias(static_cast<float*>(dmean.p), static_cast<float*>(dvar.p),
                       static_cast<float*>(dgamma.p), static_cast<float*>(dbeta.p), int(s1.k), eps,
                       dscale.p, dbias.p, g2.scale_bias_dtype(), nullptr);
  g2.run(dy1.p, dw2.p, dy2.p, static_cast<float*>(dsum2.p), static_cast<float*>(dsq2.p), ws.p,
         dscale.p, dbias.p);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> y2b(size_t(s2.n * s2.p() * s2.q() * s2.k));
  std::vector<float> mean(size_t(s1.k));
  CUDA_CHECK(cudaMemcpy(y2b.data(), dy2.p, y2b.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(mean.data(), dmean.p, mean.size() * 4, cudaMemcpyDeviceToHost));

  // The backend's ops.
  auto be = make_backend("cuda", BackendOptions{});
  Tensor flat = be->zeros({2 * s1.k});
  Tensor g = Tensor::view(flat, 0, {s1.k}), b = Tensor::view(flat, s1.k, {s1.k});
  Tensor hg = Tensor::host({s1.k}), hb = Tensor::host({s1.k});
  std::copy(gamma.begin(), gamma.end(), hg.data<float>());
  std::copy(beta.begin(), beta.end(), hb.data<float>());
  be->copy(be->from_host(hg), g);
  be->copy(be->from_host(hb), b);
  Tensor w1 = be->from_host(hw1), w2 = be->from_host(hw2);
  Tensor y1 = be->conv2d_forward(be->upload_images(hx, dt), w1, ConvParams{3, 3, 1, 1});
  BnSaved saved;
  Tensor a1 = be->batchnorm_forward_train(y1, g, b, eps, /*relu=*/true, saved);
  Tensor y2 = be->conv2d_forward(a1, w2, ConvParams{1, 1, 1, 0});
  Tensor ref = be->to_host(y2);  // canonical (N, C, H, W) order
  Tensor ref_mean = be->to_host(saved.mean);
  // The fused output as it lies (N, P, Q, K), into canonical order by the same library
  // conversion: compared element by element as it lay, it was compared against the wrong
  // elements (on an H200: 794,177 of 802,816 "off by up to 5.75").
  Tensor fused_nhwc = Tensor::host(y2.shape(), DType::f32, Layout::nhwc);
  for (size_t i = 0; i < y2b.size(); ++i)
    fused_nhwc.data<float>()[i] = dt == DType::f16 ? half_to_float(y2b[i]) : bf16_to_float(y2b[i]);
  Tensor fused = make_backend("cpu", BackendOptions{})->to_host(fused_nhwc);
  ASSERT_EQ(fused.numel(), ref.numel());

  // bf16 keeps 8 significant bits to fp16's 11: its tolerances are eight times fp16's, as in
  // ConvStats above.
  const double tol = dt == DType::f16 ? 1e-2 : 8e-2, mean_tol = dt == DType::f16 ? 2e-3 : 1.6e-2;
  for (int64_t c = 0; c < s1.k; ++c)
    EXPECT_NEAR(mean[size_t(c)], ref_mean.data<float>()[c], mean_tol * (std::fabs(ref_mean.data<float>()[c]) + 1))
        << "batch-norm mean of channel " << c;
  int64_t bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double want = ref.data<float>()[i], got = fused.data<float>()[i];
    worst = std::max(worst, std::fabs(got - want));
    bad += std::fabs(got - want) > tol * (std::fabs(want) + 1.0);
  }
  EXPECT_EQ(bad, 0) << "fused conv2 outputs away from the backend's; largest difference " << worst;
}

TEST(FusedForward, ConvBnReluConvMatchesTheBackendOps) {
  if (!cuda_backend_ready()) GTEST_SKIP() << "no CUDA device";
  conv_bn_relu_conv_matches_the_backend_ops(DType::f16);
}

// cuDNN documents the statistics node for fp16 only: a refusal skips with its reason.
TEST(FusedForward, ConvBnReluConvMatchesTheBackendOpsBf16) {
  if (!cuda_backend_ready()) GTEST_SKIP() << "no CUDA device";
  conv_bn_relu_conv_matches_the_backend_ops(DType::bf16);
}

}  // namespace
}  // namespace spotrain::cuda
