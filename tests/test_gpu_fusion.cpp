// cuDNN's graph API on a GPU (kernels/cuda/cudnn_graph.h): the convolution whose epilogue
// also writes the per-channel sum and sum of squares of its output (with and without the
// scale-bias-ReLU prologue on its input), against the convolution and the statistics
// computed on the host from the same rounded inputs, for ResNet-50-like shapes at fp16 and
// bf16. A shape cuDNN refuses is skipped with its reason (the point of the
// test on a new GPU or cuDNN is to learn which). Skips without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/philox.h"
#include "kernels/cuda/cudnn_graph.h"
#include "kernels/cuda/cuda_util.h"
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
  };
}

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
  int64_t bad_y = 0;
  double worst = 0;
  std::vector<double> ref_sum(size_t(s.k), 0.0), ref_sq(size_t(s.k), 0.0), abs_sum(size_t(s.k), 0.0);
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q)
        for (int64_t k = 0; k < s.k; ++k) {
          double acc = 0;
          for (int64_t r = 0; r < s.r; ++r)
            for (int64_t t = 0; t < s.s; ++t) {
              const int64_t ih = p * s.stride - s.pad + r, iw = q * s.stride - s.pad + t;
              if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
              const float* xp = &xf[size_t(((n * s.h + ih) * s.w + iw) * s.c)];
              const float* wp = &wf[size_t(((k * s.r + r) * s.s + t) * s.c)];
              for (int64_t c = 0; c < s.c; ++c) acc += double(xp[c]) * wp[c];
            }
          const uint16_t bits = yb[size_t(((n * P + p) * Q + q) * s.k + k)];
          const double got = s.dtype == DType::f16 ? half_to_float(bits) : bf16_to_float(bits);
          const double tol =
              (s.dtype == DType::f16 ? (pro ? 6e-3 : 2e-3) : 1.6e-2) * (std::fabs(acc) + 1.0);
          worst = std::max(worst, std::fabs(got - acc));
          bad_y += std::fabs(got - acc) > tol;
          ref_sum[size_t(k)] += got;
          ref_sq[size_t(k)] += got * got;
          abs_sum[size_t(k)] += std::fabs(got);
        }
  EXPECT_EQ(bad_y, 0) << "outputs away from the fp32 convolution; largest difference " << worst;
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

}  // namespace
}  // namespace spotrain::cuda
