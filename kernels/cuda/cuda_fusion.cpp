// CUDA backend: conv + batch-norm fusion (--fusion bn) through cuDNN's graph API. A
// convolution writes its output and the per-channel sums the next batch norm needs in one
// graph, optionally applying the previous batch norm and its ReLU as it reads its input
// (ConvStatsGraph, cudnn_graph.h); two small kernels turn the sums into the batch statistics
// and the statistics into the prologue's scale and bias. A shape, dtype or GPU cuDNN refuses
// runs the composed ops (Backend's default), decided once per shape and named by
// kernel_choices(); fp32 and --deterministic always run them.
#include "kernels/cuda/cuda_entries.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.h"

namespace spotrain::cuda {

ConvStatsGraph* CudaBackend::stats_graph(ConvEntry& e, bool prologue) {
  if (e.shape.dtype == DType::f32) return nullptr;
  std::unique_ptr<ConvStatsGraph>& slot = prologue ? e.prologue_graph : e.stats_graph;
  if (!slot) {
    // Planning finalizes engines (no kernel runs), but a step being recorded meets no new
    // shape: the eager warm-up steps plan every graph first.
    SPOTRAIN_CHECK(!capturing_, "internal: a fusion graph first planned while capturing a step");
    slot = std::make_unique<ConvStatsGraph>(dnn_, e.shape, prologue);
  }
  return slot->accepted() ? slot.get() : nullptr;
}

Tensor CudaBackend::conv2d_forward_bn_stats_impl(const Tensor& x, const Tensor& w,
                                                 const ConvParams& p, const BnApply* pro,
                                                 float eps, BnSaved* stats) {
  check_activation(x, "conv2d");
  auto& e = conv_entry(x, w, p);
  // The graphs' reductions are not documented as deterministic: --deterministic composes.
  ConvStatsGraph* g = opt_.deterministic ? nullptr : stats_graph(e, pro != nullptr);
  if (!g) return Backend::conv2d_forward_bn_stats_impl(x, w, p, pro, eps, stats);
  const DType dt = x.dtype();
  const int64_t c = x.dim(1), k = w.dim(0);
  Tensor y = alloc({x.dim(0), k, e.oh, e.ow}, dt, Layout::nhwc);
  // sum and sum of squares, each at a 16-byte aligned offset
  const int64_t k4 = (k + 3) / 4 * 4;
  Tensor sums = alloc({2 * k4}, DType::f32);
  float* sum = sums.data<float>();
  float* sqsum = sum + k4;
  CUDA_CHECK(cudaMemsetAsync(sum, 0, size_t(2 * k4) * 4, compute_));
  Tensor scale, bias;
  if (pro) {
    SPOTRAIN_CHECK(pro->gamma.numel() == c && pro->mean.numel() == c,
                   "conv2d_forward_bn_stats: the prologue has ", pro->gamma.numel(),
                   " channels, the input ", x.describe());
    scale = alloc({c}, dt);
    bias = alloc({c}, dt);
    launch_bn_scale_bias(pro->mean.data<float>(), pro->var.data<float>(),
                         pro->gamma.data<float>(), pro->beta.data<float>(), int(c), pro->eps,
                         scale.raw(), bias.raw(), dt, compute_);
  }
  g->run(x.raw(), weights_as(w, dt), y.raw(), sum, sqsum, workspace(g->workspace_bytes()),
         pro ? scale.raw() : nullptr, pro ? bias.raw() : nullptr);
  (pro ? e.prologue_ran : e.stats_ran) = true;
  if (stats) {
    *stats = BnSaved();
    stats->mean = alloc({k}, DType::f32);
    stats->var = alloc({k}, DType::f32);
    stats->backend_state[kBnInvStd] = alloc({k}, DType::f32);
    launch_bn_stats_from_sums(sum, sqsum, int(k), y.dim(0) * e.oh * e.ow, eps,
                              stats->mean.data<float>(), stats->var.data<float>(),
                              stats->backend_state[kBnInvStd].data<float>(), compute_);
  }
  return y;
}

}  // namespace spotrain::cuda
