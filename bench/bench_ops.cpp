// Microbenchmarks of the CPU backend's hot ops at ResNet-50 shapes (batch 32): the
// convolution passes, batch norm + ReLU, and the SGD update over 25.6M parameters.
#include <benchmark/benchmark.h>

#include "core/philox.h"
#include "kernels/ops.h"

using namespace spotrain;

namespace {
Backend& backend() {
  static auto be = make_backend("cpu", BackendOptions{});
  return *be;
}
Tensor random_nhwc(int64_t n, int64_t c, int64_t h, int64_t w) {
  Tensor t = Tensor::host({n, c, h, w}, DType::f32, Layout::nhwc);
  Philox r(1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = r.normal();
  return t;
}
Tensor random_w(int64_t o, int64_t i, int64_t k) {
  Tensor t = Tensor::host({o, i, k, k});
  Philox r(2);
  for (int64_t j = 0; j < t.numel(); ++j) t.data<float>()[j] = r.normal() * 0.05f;
  return t;
}
}  // namespace

// A 3x3, 64-channel, 56x56 convolution (layer1 of ResNet-50): forward, bwd-data, bwd-weights.
static void BM_conv3x3_56(benchmark::State& st) {
  Backend& be = backend();
  Tensor w = random_w(64, 64, 3);
  Tensor x0 = random_nhwc(32, 64, 56, 56);
  ConvParams p{3, 3, 1, 1};
  Tensor x = be.conv2d_forward(x0, random_w(64, 64, 1), ConvParams{1, 1, 1, 0});  // to blocked
  Tensor dw = Tensor::host({64, 64, 3, 3});
  for (auto _ : st) {
    Tensor y = be.conv2d_forward(x, w, p);
    Tensor dx = be.conv2d_backward_data(y, w, x, p);
    be.conv2d_backward_weights(x, y, p, dw);
    benchmark::DoNotOptimize(dx.raw());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(3.0 * 2 * 32 * 64 * 64 * 9 * 56 * 56 / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_conv3x3_56)->Unit(benchmark::kMillisecond);

static void BM_bn_relu_56(benchmark::State& st) {
  Backend& be = backend();
  Tensor x = be.conv2d_forward(random_nhwc(32, 64, 56, 56), random_w(256, 64, 1), ConvParams{1, 1, 1, 0});
  Tensor g = be.zeros({256}), b = be.zeros({256}), dg = be.zeros({256}), db = be.zeros({256});
  be.fill(g, 1.f);
  for (auto _ : st) {
    BnSaved s;
    Tensor y = be.batchnorm_forward_train(x, g, b, 1e-5f, true, s);
    Tensor dx = be.batchnorm_backward(y, x, g, b, s, 1e-5f, true, dg, db);
    benchmark::DoNotOptimize(dx.raw());
  }
}
BENCHMARK(BM_bn_relu_56)->Unit(benchmark::kMillisecond);

static void BM_sgd_25m(benchmark::State& st) {
  Backend& be = backend();
  int64_t n = 25557032;
  Tensor p = be.zeros({n}), g = be.zeros({n}), m = be.zeros({n});
  std::vector<SgdSegment> seg{{0, n, 5e-5f}};
  for (auto _ : st) be.sgd_step(p, g, m, seg, SgdHyper{});
  st.SetBytesProcessed(int64_t(st.iterations()) * n * 4 * 5);
}
BENCHMARK(BM_sgd_25m)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
