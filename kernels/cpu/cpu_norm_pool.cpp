// CPU batch norm (training, inference, backward; optional fused ReLU) and max pooling with
// oneDNN on the backend's activation layout. Running statistics are updated by a plain loop.
#include "kernels/cpu/bn_nhwc.h"
#include "kernels/cpu/cpu_entries.h"
#include "kernels/elementwise.h"

namespace spotrain::cpu {

using namespace dnnl;

// BnSaved::backend_state slot: oneDNN's batch-norm workspace (the ReLU mask when fused).
constexpr int kBnWorkspace = 0;

namespace {
// bf16 NHWC (bf16 where oneDNN has AMX) runs our own batch norm (bn_nhwc.h); its rows.
bool own_bn(const Tensor& x) {
  return x.layout() == Layout::nhwc && x.dtype() == DType::bf16 && bn_nhwc_bf16_usable(x.dim(1));
}
int64_t rows_of(const Tensor& x) { return x.dim(0) * x.dim(2) * x.dim(3); }
}  // namespace



CpuBackend::BnEntry& CpuBackend::bn_entry(const Tensor& x, bool relu, float eps) {
  std::string key = key_of(x) + (relu ? "|r|" : "|n|") + std::to_string(eps);
  auto it = bn_cache_.find(key);
  if (it != bn_cache_.end()) return *it->second;
  auto e = std::make_unique<BnEntry>();
  auto flags = normalization_flags::use_scale | normalization_flags::use_shift;
  if (relu) flags = flags | normalization_flags::fuse_norm_relu;
  DNNL_CHECK({
    e->fwd_pd = bn_fwd_pd(ctx_.eng, prop_kind::forward_training, md_of(x), eps, flags);
    e->fwd = batch_normalization_forward(e->fwd_pd);
  });
  auto& ref = *e;
  bn_cache_.emplace(key, std::move(e));
  return ref;
}

Tensor CpuBackend::batchnorm_forward_train_impl(const Tensor& x, const Tensor& gamma,
                                                const Tensor& beta, float eps, bool relu,
                                                BnSaved& saved) {
  SPOTRAIN_CHECK(x.ndim() == 4 && gamma.numel() == x.dim(1), "batchnorm: input ", x.describe(),
                 " has ", x.dim(1), " channels, parameters have ", gamma.numel());
  if (via_f32(x.dtype()))
    return cast(batchnorm_forward_train(f32(x), gamma, beta, eps, relu, saved), x.dtype());
  int64_t c = x.dim(1);
  Tensor y = alloc_like(x, x.dtype());
  saved.mean = Tensor({c}, DType::f32, allocator());
  saved.var = Tensor({c}, DType::f32, allocator());
  if (own_bn(x)) {
    bn_nhwc_bf16_forward_train(x.data<uint16_t>(), nullptr, rows_of(x), c, gamma.data<float>(),
                               beta.data<float>(), eps, relu, y.data<uint16_t>(),
                               saved.mean.data<float>(), saved.var.data<float>());
    saved.backend_state[kBnWorkspace] = Tensor();
    return y;
  }
  auto& e = bn_entry(x, relu, eps);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, mem_of(ctx_, x)},          {DNNL_ARG_DST, mem_of(ctx_, y)},
      {DNNL_ARG_SCALE, mem_of(ctx_, gamma)},    {DNNL_ARG_SHIFT, mem_of(ctx_, beta)},
      {DNNL_ARG_MEAN, mem_of(ctx_, saved.mean)}, {DNNL_ARG_VARIANCE, mem_of(ctx_, saved.var)}};
  if (relu) {
    auto wmd = e.fwd_pd.workspace_desc();
    saved.backend_state[kBnWorkspace] = alloc_for(allocator(), wmd);
    args.emplace(DNNL_ARG_WORKSPACE, memory(wmd, ctx_.eng, saved.backend_state[kBnWorkspace].raw()));
  } else {
    saved.backend_state[kBnWorkspace] = Tensor();
  }
  DNNL_EXEC(e.fwd.execute(ctx_.strm, args));
  return y;
}

// relu(batchnorm(x) + z): one pass where our own batch norm runs (bf16 NHWC), else the
// composed ops. Either way the output is kept for the backward's ReLU mask (the composed
// backward reads it from BnSaved::kComposedOutput).
Tensor CpuBackend::batchnorm_add_relu_forward_train_impl(const Tensor& x, const Tensor& z,
                                                         const Tensor& gamma, const Tensor& beta,
                                                         float eps, BnSaved& saved) {
  if (!own_bn(x) || z.layout() != x.layout() || z.dtype() != x.dtype())
    return composed_batchnorm_add_relu_forward_train(x, z, gamma, beta, eps, saved);
  const int64_t c = x.dim(1);
  Tensor y = alloc_like(x, x.dtype());
  saved.mean = Tensor({c}, DType::f32, allocator());
  saved.var = Tensor({c}, DType::f32, allocator());
  bn_nhwc_bf16_forward_train(x.data<uint16_t>(), z.data<uint16_t>(), rows_of(x), c,
                             gamma.data<float>(), beta.data<float>(), eps, true,
                             y.data<uint16_t>(), saved.mean.data<float>(), saved.var.data<float>());
  saved.backend_state[kBnWorkspace] = Tensor();
  saved.backend_state[BnSaved::kComposedOutput] = y;
  return y;
}

Tensor CpuBackend::batchnorm_forward_infer_impl(const Tensor& x, const Tensor& gamma,
                                                const Tensor& beta, const Tensor& running_mean,
                                                const Tensor& running_var, float eps, bool relu) {
  if (via_f32(x.dtype()))
    return cast(batchnorm_forward_infer(f32(x), gamma, beta, running_mean, running_var, eps, relu),
                x.dtype());
  if (own_bn(x)) {
    Tensor y = alloc_like(x, x.dtype());
    bn_nhwc_bf16_forward_infer(x.data<uint16_t>(), rows_of(x), x.dim(1), gamma.data<float>(),
                               beta.data<float>(), running_mean.data<float>(),
                               running_var.data<float>(), eps, relu, y.data<uint16_t>());
    return y;
  }
  auto& e = bn_entry(x, relu, eps);
  if (!e.have_inf) {
    auto flags = normalization_flags::use_scale | normalization_flags::use_shift |
                 normalization_flags::use_global_stats;
    if (relu) flags = flags | normalization_flags::fuse_norm_relu;
    DNNL_CHECK({
      e.inf_pd = bn_fwd_pd(ctx_.eng, prop_kind::forward_inference, md_of(x), eps, flags);
      e.inf = batch_normalization_forward(e.inf_pd);
    });
    e.have_inf = true;
  }
  Tensor y = alloc_like(x, x.dtype());
  DNNL_EXEC(e.inf.execute(ctx_.strm, {{DNNL_ARG_SRC, mem_of(ctx_, x)},
                                       {DNNL_ARG_DST, mem_of(ctx_, y)},
                                       {DNNL_ARG_SCALE, mem_of(ctx_, gamma)},
                                       {DNNL_ARG_SHIFT, mem_of(ctx_, beta)},
                                       {DNNL_ARG_MEAN, mem_of(ctx_, running_mean)},
                                       {DNNL_ARG_VARIANCE, mem_of(ctx_, running_var)}}));
  return y;
}

Tensor CpuBackend::batchnorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                           const Tensor& beta, const BnSaved& saved, float eps,
                                           bool relu, Tensor& dgamma, Tensor& dbeta) {
  if (via_f32(x.dtype()))
    return cast(batchnorm_backward(f32(dy), f32(x), gamma, beta, saved, eps, relu, dgamma, dbeta),
                x.dtype());
  if (own_bn(x)) {
    Tensor dx = alloc_like(x, x.dtype());
    Tensor hdy;
    memory ddst = as_desc(dy, md_of(x), hdy);
    bn_nhwc_bf16_backward(static_cast<const uint16_t*>(ddst.get_data_handle()), x.data<uint16_t>(),
                          rows_of(x), x.dim(1), gamma.data<float>(), beta.data<float>(),
                          saved.mean.data<float>(), saved.var.data<float>(), eps, relu,
                          dx.data<uint16_t>(), dgamma.data<float>(), dbeta.data<float>());
    return dx;
  }
  auto& e = bn_entry(x, relu, eps);
  if (!e.have_bwd) {
    auto flags = normalization_flags::use_scale | normalization_flags::use_shift;
    if (relu) flags = flags | normalization_flags::fuse_norm_relu;
    DNNL_CHECK({
      e.bwd_pd = bn_bwd_pd(ctx_.eng, md_of(dy), md_of(x), eps, flags, e.fwd_pd);
      e.bwd = batch_normalization_backward(e.bwd_pd);
    });
    e.have_bwd = true;
  }
  Tensor dx = alloc_like(x, x.dtype());
  Tensor hdy;
  memory ddst = as_desc(dy, md_of(x), hdy);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, mem_of(ctx_, x)},           {DNNL_ARG_DIFF_DST, ddst},
      {DNNL_ARG_MEAN, mem_of(ctx_, saved.mean)}, {DNNL_ARG_VARIANCE, mem_of(ctx_, saved.var)},
      {DNNL_ARG_SCALE, mem_of(ctx_, gamma)},     {DNNL_ARG_SHIFT, mem_of(ctx_, beta)},
      {DNNL_ARG_DIFF_SRC, mem_of(ctx_, dx)},     {DNNL_ARG_DIFF_SCALE, mem_of(ctx_, dgamma)},
      {DNNL_ARG_DIFF_SHIFT, mem_of(ctx_, dbeta)}};
  if (relu)
    args.emplace(DNNL_ARG_WORKSPACE,
                 memory(e.fwd_pd.workspace_desc(), ctx_.eng, saved.backend_state[kBnWorkspace].raw()));
  DNNL_EXEC(e.bwd.execute(ctx_.strm, args));
  return dx;
}

void CpuBackend::batchnorm_update_running_impl(Tensor& running_mean, Tensor& running_var,
                                               const BnSaved& saved, float momentum, int64_t n) {
  float* rm = running_mean.data<float>();
  float* rv = running_var.data<float>();
  const float* m = saved.mean.data<float>();
  const float* v = saved.var.data<float>();
  double unbias = n > 1 ? double(n) / double(n - 1) : 1.0;
  for (int64_t c = 0; c < running_mean.numel(); ++c)
    bn_running_update(rm[c], rv[c], m[c], v[c], momentum, unbias);
}

Tensor CpuBackend::maxpool_forward_impl(const Tensor& x, const PoolParams& p, Tensor& workspace) {
  if (via_f32(x.dtype())) return cast(maxpool_forward(f32(x), p, workspace), x.dtype());
  std::string key = key_of(x) + "|" + std::to_string(p.k) + "," + std::to_string(p.stride) +
                    "," + std::to_string(p.pad);
  auto it = pool_cache_.find(key);
  if (it == pool_cache_.end()) {
    auto e = std::make_unique<PoolEntry>();
    int64_t oh = (x.dim(2) + 2 * p.pad - p.k) / p.stride + 1;
    int64_t ow = (x.dim(3) + 2 * p.pad - p.k) / p.stride + 1;
    memory::desc dst({x.dim(0), x.dim(1), oh, ow}, dnnl_dtype(x.dtype()), act_tag());
    DNNL_CHECK({
      e->fwd_pd = maxpool_fwd_pd(ctx_.eng, md_of(x), dst, {p.stride, p.stride}, {p.k, p.k},
                                 {p.pad, p.pad});
      e->fwd = pooling_forward(e->fwd_pd);
    });
    it = pool_cache_.emplace(key, std::move(e)).first;
  }
  auto& e = *it->second;
  auto dd = dims_of(e.fwd_pd.dst_desc());
  Tensor y = alloc_act(Shape(dd.begin(), dd.end()), x.dtype());
  workspace = alloc_for(allocator(), e.fwd_pd.workspace_desc());
  DNNL_EXEC(e.fwd.execute(
      ctx_.strm, {{DNNL_ARG_SRC, mem_of(ctx_, x)}, {DNNL_ARG_DST, mem_of(ctx_, y)},
                  {DNNL_ARG_WORKSPACE, memory(e.fwd_pd.workspace_desc(), ctx_.eng, workspace.raw())}}));
  return y;
}

Tensor CpuBackend::maxpool_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& workspace,
                                         const PoolParams& p) {
  if (via_f32(x.dtype()))
    return cast(maxpool_backward(f32(dy), f32(x), workspace, p), x.dtype());
  std::string key = key_of(x) + "|" + std::to_string(p.k) + "," + std::to_string(p.stride) +
                    "," + std::to_string(p.pad);
  auto it = pool_cache_.find(key);
  SPOTRAIN_CHECK(it != pool_cache_.end(), "internal: maxpool backward before forward");
  auto& e = *it->second;
  if (!e.have_bwd) {
    DNNL_CHECK({
      e.bwd_pd = maxpool_bwd_pd(ctx_.eng, md_of(x), e.fwd_pd.dst_desc(), {p.stride, p.stride},
                                {p.k, p.k}, {p.pad, p.pad}, e.fwd_pd);
      e.bwd = pooling_backward(e.bwd_pd);
    });
    e.have_bwd = true;
  }
  // diff_src follows md_of(x): the gradient takes the input's layout (NHWC stays NHWC).
  Tensor dx = alloc_like(x, x.dtype());
  Tensor hdy;
  memory ddst = as_desc(dy, e.bwd_pd.diff_dst_desc(), hdy);
  DNNL_EXEC(e.bwd.execute(
      ctx_.strm, {{DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_SRC, mem_of(ctx_, dx)},
                  {DNNL_ARG_WORKSPACE, memory(e.fwd_pd.workspace_desc(), ctx_.eng, workspace.raw())}}));
  return dx;
}

}  // namespace spotrain::cpu
