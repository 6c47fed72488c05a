// CUDA backend: conv + batch-norm fusion (--fusion bn) through cuDNN's graph API
// (cudnn_graph.h). Forward: a convolution writes its output and the per-channel sums the next
// batch norm needs in one graph, optionally applying the previous batch norm and its ReLU as it
// reads its input (a block's last convolution: that prologue alone); small kernels turn the
// sums into the batch statistics and the statistics into the prologue's scale and bias. Backward through such a convolution and its prologue: the
// weight gradient with the same prologue, and the data gradient fused with the ReLU's backward
// and the batch norm's weight gradients, whose coefficients give the batch norm's input
// gradient in one elementwise kernel. Each graph cuDNN refuses for a shape, dtype or GPU (or
// accepts but then fails to run the first time) runs as the composed ops (Backend's
// composed_*), decided once per shape and graph; fp32 and
// --deterministic always run them.
#include "kernels/cuda/cuda_entries.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.h"

namespace spotrain::cuda {

FusedGraph* CudaBackend::fusion_graph(ConvEntry& e, int which) {
  if (e.shape.dtype == DType::f32) return nullptr;
  std::unique_ptr<FusedGraph>& slot = e.fused[which];
  if (!slot) {
    // Planning finalizes engines (no kernel runs), but a step being recorded meets no new
    // shape: the eager warm-up steps plan every graph first.
    SPOTRAIN_CHECK(!capturing_, "internal: a fusion graph first planned while capturing a step");
    // Timed at its first run and remembered per shape (--autotune, --kernel-cache), within
    // the run's planning budget.
    GraphTuning t{opt_.autotune, kernel_cache_.get(), str("graph ", fusion_graph_name(which), " ", e.key),
                  &plan_budget_};
    ++plan_budget_.graphs;
    try {
      switch (which) {
        case kStatsGraph: slot = std::make_unique<ConvStatsGraph>(dnn_, e.shape, false, true, t); break;
        case kPrologueGraph: slot = std::make_unique<ConvStatsGraph>(dnn_, e.shape, true, true, t); break;
        case kPrologueOnlyGraph:
          slot = std::make_unique<ConvStatsGraph>(dnn_, e.shape, true, false, t);
          break;
        case kWgradGraph: slot = std::make_unique<ConvWgradGraph>(dnn_, e.shape, t); break;
        default: slot = std::make_unique<DgradDreluDbnGraph>(dnn_, e.shape, t); break;
      }
    } catch (const Error& err) {  // a graph cuDNN errs on is refused like one it declines
      slot = std::make_unique<FailedGraph>(dnn_, err.what());
    }
  }
  return slot->accepted() ? slot.get() : nullptr;
}

bool CudaBackend::run_fused(ConvEntry& e, int which, const std::function<void()>& run) {
  if (e.fused_ran[which] || capturing_) {
    run();
  } else {
    try {
      run();
    } catch (const Error& err) {
      // Handled (the separate ops run instead): a CUDA error the failed run left pending is
      // cleared, or it would surface at the next kernel's check.
      (void)cudaGetLastError();
      e.fused[which]->failed_to_run(err.what());
      return false;
    }
  }
  e.fused_ran[which] = true;
  return true;
}

namespace {
// The prologue's scale and bias in `dt` (the graph's scale_bias_dtype()): x * scale + bias =
// bn(x) with pro's statistics.
void scale_bias(const BnApply& pro, DType dt, Tensor& scale, Tensor& bias, cudaStream_t s) {
  launch_bn_scale_bias(pro.mean.data<float>(), pro.var.data<float>(), pro.gamma.data<float>(),
                       pro.beta.data<float>(), int(pro.gamma.numel()), pro.eps, scale.raw(),
                       bias.raw(), dt, s);
}
}  // namespace

Tensor CudaBackend::conv2d_forward_bn_stats_impl(const Tensor& x, const Tensor& w,
                                                 const ConvParams& p, const BnApply* pro,
                                                 float eps, BnSaved* stats) {
  check_activation(x, "conv2d");
  auto& e = conv_entry(x, w, p);
  // The graphs' reductions are not documented as deterministic: --deterministic composes.
  const int which = !pro ? kStatsGraph : stats ? kPrologueGraph : kPrologueOnlyGraph;
  auto* g = static_cast<ConvStatsGraph*>(
      opt_.deterministic || (!pro && !stats) ? nullptr : fusion_graph(e, which));
  if (!g) return composed_conv2d_forward_bn_stats(x, w, p, pro, eps, stats);
  const DType dt = x.dtype();
  const int64_t c = x.dim(1), k = w.dim(0);
  const WorkspaceFn shared_workspace = [this](size_t bytes) { return workspace(bytes); };
  Tensor y = alloc({x.dim(0), k, e.oh, e.ow}, dt, Layout::nhwc);
  // sum and sum of squares, each at a 16-byte aligned offset
  const int64_t k4 = (k + 3) / 4 * 4;
  Tensor sums;
  float *sum = nullptr, *sqsum = nullptr;
  if (stats) {
    sums = alloc({2 * k4}, DType::f32);
    sum = sums.data<float>();
    sqsum = sum + k4;
    CUDA_CHECK(cudaMemsetAsync(sum, 0, size_t(2 * k4) * 4, compute_));
  }
  Tensor scale, bias;
  if (pro) {
    SPOTRAIN_CHECK(pro->gamma.numel() == c && pro->mean.numel() == c,
                   "conv2d_forward_bn_stats: the prologue has ", pro->gamma.numel(),
                   " channels, the input ", x.describe());
    scale = alloc({c}, g->scale_bias_dtype());
    bias = alloc({c}, g->scale_bias_dtype());
    scale_bias(*pro, g->scale_bias_dtype(), scale, bias, compute_);
  }
  if (!run_fused(e, which, [&] {
        g->run(x.raw(), weights_as(w, dt), y.raw(), sum, sqsum, shared_workspace,
               pro ? scale.raw() : nullptr, pro ? bias.raw() : nullptr);
      }))
    return composed_conv2d_forward_bn_stats(x, w, p, pro, eps, stats);
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

Tensor CudaBackend::conv2d_backward_bn_relu_impl(const Tensor& dy, const Tensor& w,
                                                 const Tensor& x, const ConvParams& p,
                                                 const BnApply& pro, const BnSaved& saved,
                                                 Tensor& dw, Tensor& dgamma, Tensor& dbeta) {
  check_activation(x, "conv2d_backward_bn_relu");
  check_activation(dy, "conv2d_backward_bn_relu");
  auto& e = conv_entry(x, w, p);
  auto* wg = static_cast<ConvWgradGraph*>(opt_.deterministic ? nullptr : fusion_graph(e, kWgradGraph));
  auto* dg = static_cast<DgradDreluDbnGraph*>(
      opt_.deterministic || !saved.backend_state[kBnInvStd].defined() ? nullptr
                                                                       : fusion_graph(e, kDgradGraph));
  if (!wg && !dg)
    return composed_conv2d_backward_bn_relu(dy, w, x, p, pro, saved, dw, dgamma, dbeta);
  const DType dt = x.dtype();
  const int64_t c = x.dim(1);
  const WorkspaceFn shared_workspace = [this](size_t bytes) { return workspace(bytes); };
  // relu(bn(x)), the convolution's input, made only for a part whose graph cuDNN refused.
  Tensor a;
  auto applied = [&]() -> const Tensor& {
    if (!a.defined())
      a = batchnorm_forward_infer(x, pro.gamma, pro.beta, pro.mean, pro.var, pro.eps, true);
    return a;
  };

  // The weight gradient, in the filter's (O, H, W, I) layout and x's dtype, then into dw.
  bool wgrad_done = false;
  if (wg) {
    Tensor scale = alloc({c}, wg->scale_bias_dtype()), bias = alloc({c}, wg->scale_bias_dtype());
    scale_bias(pro, wg->scale_bias_dtype(), scale, bias, compute_);
    Tensor tmp(dw.shape(), dt, allocator(), Layout::nhwc);
    wgrad_done = run_fused(e, kWgradGraph, [&] {
      wg->run(x.raw(), dy.raw(), tmp.raw(), scale.raw(), bias.raw(), shared_workspace);
    });
    if (wgrad_done)
      launch_ohwi_to_oihw(tmp.raw(), dt, dw.data<float>(), int(dw.dim(0)), int(dw.dim(1)),
                          int(dw.dim(2)), int(dw.dim(3)), compute_);
  }
  if (!wgrad_done) conv2d_backward_weights(applied(), dy, p, dw);

  auto composed_dgrad = [&] {
    Tensor in = applied();
    Tensor g = relu_backward(conv2d_backward_data(dy, w, in, p), in);
    return batchnorm_backward(g, x, pro.gamma, pro.beta, saved, pro.eps, false, dgamma, dbeta);
  };
  if (!dg) return composed_dgrad();
  // The data gradient through the ReLU, the batch norm's weight gradients and the
  // coefficients of its input gradient; every per-channel buffer 16-byte aligned (gamma and
  // beta are views of the flat parameter buffer: copied where they are not).
  const int64_t c4 = (c + 3) / 4 * 4;
  Tensor per_channel = alloc({5 * c4}, DType::f32);
  float* out = per_channel.data<float>();
  Tensor hg, hb;
  DgradDreluDbnGraph::Args args;
  args.dy = dy.raw();
  args.w = weights_as(w, dt);
  args.x = x.raw();
  args.mean = saved.mean.data<float>();
  args.invstd = saved.backend_state[kBnInvStd].data<float>();
  args.gamma = aligned(pro.gamma, hg);
  args.beta = aligned(pro.beta, hb);
  Tensor g = alloc_like(x);
  args.g = g.raw();
  args.dgamma = out;
  args.dbeta = out + c4;
  args.eq_dy = out + 2 * c4;
  args.eq_x = out + 3 * c4;
  args.eq_bias = out + 4 * c4;
  if (!run_fused(e, kDgradGraph, [&] { dg->run(args, shared_workspace); }))
    return composed_dgrad();
  CUDA_CHECK(cudaMemcpyAsync(dgamma.raw(), args.dgamma, size_t(c) * 4, cudaMemcpyDeviceToDevice,
                             compute_));
  CUDA_CHECK(cudaMemcpyAsync(dbeta.raw(), args.dbeta, size_t(c) * 4, cudaMemcpyDeviceToDevice,
                             compute_));
  Tensor dx = alloc_like(x);
  launch_bn_bwd_apply(g.raw(), x.raw(), dx.raw(), dt, x.numel(), int(c), args.eq_dy, args.eq_x,
                      args.eq_bias, compute_);
  return dx;
}

}  // namespace spotrain::cuda
