// CUDA backend: batch norm (training through cuDNN's Ex API, with fused ReLU where cuDNN
// supports it for the shape and dtype, else our ReLU kernel; fused Add + ReLU for a residual
// block's last BN; inference and the running statistics with our kernels) and max pooling
// (our kernels).
#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "kernels/cuda/cuda_entries.h"
#include "kernels/cuda/cuda_util.h"

namespace spotrain::cuda {

namespace {
const float kOne = 1.f, kZero = 0.f;
}  // namespace

// ---- batch norm ------------------------------------------------------------------------------

namespace {
struct BnConfig {
  cudnnBatchNormMode_t mode;
  cudnnBatchNormOps_t ops;
  const char* name;  // for kernel_choices
};
// Tried in order at the first use of a shape; the first cuDNN accepts is kept. With ReLU the
// search starts at 0 (fused), without at 1.
const BnConfig kBnConfigs[] = {
    {CUDNN_BATCHNORM_SPATIAL_PERSISTENT, CUDNN_BATCHNORM_OPS_BN_ACTIVATION, "persistent+relu"},
    {CUDNN_BATCHNORM_SPATIAL_PERSISTENT, CUDNN_BATCHNORM_OPS_BN, "persistent"},
    {CUDNN_BATCHNORM_SPATIAL, CUDNN_BATCHNORM_OPS_BN, "spatial"},
};
constexpr int kNumBnConfigs = 3;
}  // namespace

// The batch-norm part of kernel_choices(): per shape, the configuration without and with
// ReLU, whether BN + Add + ReLU ran fused, the backward's from statistics without a reserve
// space (--fusion bn), and the fp32 fallback.
std::vector<std::string> CudaBackend::bn_choices() const {
  auto cfg = [](int i) { return i < 0 ? std::string("unused") : std::string(kBnConfigs[i].name); };
  std::vector<std::string> out;
  for (const auto& [key, e] : bn_cache_) {
    std::string add = e->add_fused < 0 ? "unused" : e->add_fused ? "fused" : "refused (BN, Add, ReLU)";
    out.push_back(str("batchnorm ", key, ": ", e->f32 ? "fp32 fallback" : "cuDNN", ", plain ",
                      cfg(e->cfg[0]), ", with relu ", cfg(e->cfg[1]), ", bn+add+relu ", add,
                      ", backward without reserve ", cfg(e->cfg_bare)));
  }
  return out;
}

CudaBackend::BnEntry& CudaBackend::bn_entry(const Tensor& x) {
  std::string key = key_of(x);
  auto it = bn_cache_.find(key);
  if (it != bn_cache_.end()) return *it->second;
  auto e = std::make_unique<BnEntry>();
  e->x = nhwc_desc(x.dtype(), x.dim(0), x.dim(1), x.dim(2), x.dim(3));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->stats));
  // Per-channel parameters and statistics: 1 x C x 1 x 1 fp32 (what the derivation gives for
  // fp32/fp16/bf16 activations; set directly where a cuDNN build does not derive one for bf16).
  if (!cudnn_ok(cudnnDeriveBNTensorDescriptor(e->stats, e->x, CUDNN_BATCHNORM_SPATIAL)))
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(e->stats, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1,
                                           int(x.dim(1)), 1, 1));
  CUDNN_CHECK(cudnnCreateActivationDescriptor(&e->act));
  CUDNN_CHECK(
      cudnnSetActivationDescriptor(e->act, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
  auto& ref = *e;
  bn_cache_.emplace(key, std::move(e));
  return ref;
}

CudaBackend::BnArgs CudaBackend::bn_args(const Tensor& gamma, const Tensor& beta, int64_t c,
                                          BnSaved* saved) {
  // Every per-channel pointer handed to cuDNN is 16-byte aligned (its NHWC kernels load them
  // as vectors): gamma and beta are copied when their offsets in the flat buffer are not.
  BnArgs a;
  a.g = aligned(gamma, a.hg);
  a.b = aligned(beta, a.hb);
  // Forward: cuDNN also updates running statistics; ours are updated by
  // batchnorm_update_running, so it gets scratch ones (factor 1: overwritten, never read;
  // zeroed so that no NaN lingers). Backward: the parameter gradients go to scratch, then
  // into the flat gradient buffer (bn_grads_out).
  const int64_t c4 = (c + 3) / 4 * 4;
  a.scratch = Tensor({2 * c4}, DType::f32, allocator());
  if (saved) {
    saved->mean = alloc({c}, DType::f32);
    saved->backend_state[kBnInvStd] = alloc({c}, DType::f32);
    saved->var = alloc({c}, DType::f32);
    a.rm = a.scratch.data<float>();
    a.rv = a.rm + c4;
    CUDA_CHECK(cudaMemsetAsync(a.rm, 0, size_t(2 * c4) * 4, compute_));
  } else {
    a.dg = a.scratch.data<float>();
    a.db = a.dg + c4;
  }
  return a;
}

void CudaBackend::bn_grads_out(const BnArgs& a, int64_t c, Tensor& dgamma, Tensor& dbeta) {
  CUDA_CHECK(
      cudaMemcpyAsync(dgamma.raw(), a.dg, size_t(c) * 4, cudaMemcpyDeviceToDevice, compute_));
  CUDA_CHECK(
      cudaMemcpyAsync(dbeta.raw(), a.db, size_t(c) * 4, cudaMemcpyDeviceToDevice, compute_));
}

Tensor CudaBackend::batchnorm_forward_train_impl(const Tensor& x, const Tensor& gamma,
                                                 const Tensor& beta, float eps, bool relu,
                                                 BnSaved& saved) {
  check_activation(x, "batchnorm");
  int64_t c = x.dim(1);
  SPOTRAIN_CHECK(gamma.numel() == c && beta.numel() == c, "batchnorm: input ", x.describe(),
                 " has ", c, " channels, parameters have ", gamma.numel());
  SPOTRAIN_CHECK(eps >= CUDNN_BN_MIN_EPSILON, "batchnorm: eps ", eps, " is below cuDNN's minimum ",
                 CUDNN_BN_MIN_EPSILON);
  auto& e = bn_entry(x);
  // The fp32 route: statistics and normalization in fp32, ReLU after the cast back, so what
  // backward keeps (saved.backend_state[kBnOutput]) stays in x's dtype.
  auto via_f32 = [&] {
    Tensor y32 = batchnorm_forward_train(cast(x, DType::f32), gamma, beta, eps, false, saved);
    Tensor yc = cast(y32, x.dtype());
    if (relu) launch_relu_fwd(yc.raw(), yc.raw(), yc.dtype(), yc.numel(), compute_);
    saved.backend_state[kBnOutput] = relu ? yc : Tensor();
    return yc;
  };
  if (e.f32) return via_f32();
  Tensor y = alloc_like(x);
  BnArgs a = bn_args(gamma, beta, c, &saved);
  int& chosen = e.cfg[relu ? 1 : 0];
  int first = chosen >= 0 ? chosen : (relu ? 0 : 1);
  int last = chosen >= 0 ? chosen : kNumBnConfigs - 1;
  bool done = false;
  try {
    for (int i = first; i <= last && !done; ++i) {
      const BnConfig& cf = kBnConfigs[i];
      bool fused = cf.ops == CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
      cudnnActivationDescriptor_t act = fused ? e.act : nullptr;
      bool probing = chosen < 0 && i < last;  // NOT_SUPPORTED moves on to the next config
      size_t ws = 0, rs = 0;
      cudnnStatus_t st = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
          dnn_, cf.mode, cf.ops, e.x, nullptr, e.x, e.stats, act, &ws);
      if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(dnn_, cf.mode, cf.ops, act, e.x,
                                                                  &rs);
      Tensor reserve;
      if (st == CUDNN_STATUS_SUCCESS) {
        if (rs > 0) reserve = Tensor({int64_t((rs + 3) / 4)}, DType::f32, allocator());
        st = cudnnBatchNormalizationForwardTrainingEx(
            dnn_, cf.mode, cf.ops, &kOne, &kZero, e.x, x.raw(), nullptr, nullptr, e.x, y.raw(),
            e.stats, a.g, a.b, 1.0, a.rm, a.rv, double(eps), saved.mean.raw(), saved.backend_state[kBnInvStd].raw(), act,
            workspace(ws), ws, rs > 0 ? reserve.raw() : nullptr, rs);
      }
      // cuDNN 9 returns sub-codes (CUDNN_STATUS_NOT_SUPPORTED_SHAPE, ...): compare categories.
      if (probing && (CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_NOT_SUPPORTED ||
                      CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_BAD_PARAM))
        continue;
      CUDNN_CHECK(st);
      chosen = i;
      done = true;
      saved.backend_state[kBnReserve] = reserve;
      if (relu && !fused) {
        launch_relu_fwd(y.raw(), y.raw(), y.dtype(), y.numel(), compute_);
      }
    }
  } catch (const Error& err) {
    // A dtype no configuration takes (found at the first use of a shape): fp32 instead.
    if (x.dtype() == DType::f32 || e.cfg[0] >= 0 || e.cfg[1] >= 0) throw;
    std::fprintf(stderr, "note: batch norm on %s runs in fp32: %s\n", x.describe().c_str(),
                 err.what());
    e.f32 = true;
    return via_f32();
  }
  SPOTRAIN_CHECK(done, "internal: no batch-norm configuration ran");
  saved.backend_state[kBnOutput] = relu ? y : Tensor();
  launch_invstd_to_var(saved.backend_state[kBnInvStd].data<float>(), saved.var.data<float>(), int(c), eps, compute_);
  return y;
}

Tensor CudaBackend::batchnorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                            const Tensor& beta, const BnSaved& saved, float eps,
                                            bool relu, Tensor& dgamma, Tensor& dbeta) {
  check_activation(x, "batchnorm_backward");
  check_activation(dy, "batchnorm_backward");
  SPOTRAIN_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype(),
                 "batchnorm_backward: gradient ", dy.describe(), " does not match ", x.describe());
  auto& e = bn_entry(x);
  if (e.f32) {  // see batchnorm_forward_train
    SPOTRAIN_CHECK(!relu || saved.backend_state[kBnOutput].defined(),
                   "internal: batch-norm backward without its training forward");
    Tensor g = relu ? relu_backward(dy, saved.backend_state[kBnOutput]) : dy;
    return cast(batchnorm_backward(cast(g, DType::f32), cast(x, DType::f32), gamma, beta, saved,
                                   eps, false, dgamma, dbeta),
                x.dtype());
  }
  const Tensor& reserve = saved.backend_state[kBnReserve];
  // Statistics with no reserve space (conv2d_forward_bn_stats under --fusion bn makes them
  // outside cuDNN, or a forward that kept none): the plain configurations that need none are
  // probed here, persistent first, and the choice kept apart from the forward's.
  const bool bare = !relu && !reserve.defined();
  int& chosen = bare ? e.cfg_bare : e.cfg[relu ? 1 : 0];
  const bool probing = chosen < 0 && bare;
  SPOTRAIN_CHECK((chosen >= 0 || probing) && saved.backend_state[kBnInvStd].defined() &&
                     (!relu || saved.backend_state[kBnOutput].defined()),
                 "internal: batch-norm backward without its training forward");
  int64_t c = x.dim(1);
  Tensor dx = alloc_like(x);
  BnArgs a = bn_args(gamma, beta, c, nullptr);
  Tensor g = dy;
  for (int i = probing ? 1 : chosen; i <= (probing ? kNumBnConfigs - 1 : chosen); ++i) {
    const BnConfig& cf = kBnConfigs[i];
    bool fused = cf.ops == CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
    cudnnActivationDescriptor_t act = fused ? e.act : nullptr;
    if (relu && !fused) g = relu_backward(dy, saved.backend_state[kBnOutput]);
    size_t ws = 0, rs = 0;
    cudnnStatus_t st = cudnnGetBatchNormalizationBackwardExWorkspaceSize(
        dnn_, cf.mode, cf.ops, e.x, fused ? e.x : nullptr, e.x, nullptr, e.x, e.stats, act, &ws);
    // A configuration whose forward keeps a reserve space cannot run without that forward.
    if (st == CUDNN_STATUS_SUCCESS && bare)
      st = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(dnn_, cf.mode, cf.ops, act, e.x, &rs);
    if (st == CUDNN_STATUS_SUCCESS && rs > 0) st = CUDNN_STATUS_NOT_SUPPORTED;
    if (st == CUDNN_STATUS_SUCCESS)
      st = cudnnBatchNormalizationBackwardEx(
          dnn_, cf.mode, cf.ops, &kOne, &kZero, &kOne, &kZero, e.x, x.raw(), fused ? e.x : nullptr,
          fused ? saved.backend_state[kBnOutput].raw() : nullptr, e.x, g.raw(), nullptr, nullptr,
          e.x, dx.raw(), e.stats, a.g, a.b, a.dg, a.db, double(eps), saved.mean.raw(),
          saved.backend_state[kBnInvStd].raw(), act, workspace(ws), ws,
          reserve.defined() ? reserve.raw() : nullptr, reserve.defined() ? reserve.nbytes() : 0);
    if (probing && i < kNumBnConfigs - 1 &&
        (CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_NOT_SUPPORTED ||
         CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_BAD_PARAM))
      continue;
    CUDNN_CHECK(st);
    chosen = i;
    break;
  }
  bn_grads_out(a, c, dgamma, dbeta);
  return dx;
}

// relu(bn(x) + z) in one cuDNN call (CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION, persistent NHWC
// kernels): the block's Add and ReLU never touch memory on their own. Where cuDNN refuses the
// shape or dtype at its first use, the op is composed of BN and Add from then on.
Tensor CudaBackend::batchnorm_add_relu_forward_train_impl(const Tensor& x, const Tensor& z,
                                                          const Tensor& gamma, const Tensor& beta,
                                                          float eps, BnSaved& saved) {
  check_activation(x, "batchnorm_add_relu");
  check_activation(z, "batchnorm_add_relu");
  SPOTRAIN_CHECK(z.shape() == x.shape() && z.dtype() == x.dtype(), "batchnorm_add_relu: residual ",
                 z.describe(), " does not match ", x.describe());
  int64_t c = x.dim(1);
  SPOTRAIN_CHECK(gamma.numel() == c && beta.numel() == c, "batchnorm: input ", x.describe(),
                 " has ", c, " channels, parameters have ", gamma.numel());
  auto& e = bn_entry(x);
  if (e.add_fused == 0 || e.f32 || !fuse_bn_add_)
    return composed_batchnorm_add_relu_forward_train(x, z, gamma, beta, eps, saved);
  Tensor y = alloc_like(x);
  BnSaved s;
  BnArgs a = bn_args(gamma, beta, c, &s);
  const auto mode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
  const auto ops = CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION;
  size_t ws = 0, rs = 0;
  cudnnStatus_t st = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
      dnn_, mode, ops, e.x, e.x, e.x, e.stats, e.act, &ws);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(dnn_, mode, ops, e.act, e.x, &rs);
  Tensor reserve;
  if (st == CUDNN_STATUS_SUCCESS) {
    if (rs > 0) reserve = Tensor({int64_t((rs + 3) / 4)}, DType::f32, allocator());
    st = cudnnBatchNormalizationForwardTrainingEx(
        dnn_, mode, ops, &kOne, &kZero, e.x, x.raw(), e.x, z.raw(), e.x, y.raw(), e.stats, a.g,
        a.b, 1.0, a.rm, a.rv, double(eps), s.mean.raw(), s.backend_state[kBnInvStd].raw(), e.act, workspace(ws), ws,
        rs > 0 ? reserve.raw() : nullptr, rs);
  }
  if (e.add_fused < 0 && (CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_NOT_SUPPORTED ||
                          CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_BAD_PARAM)) {
    e.add_fused = 0;
    return composed_batchnorm_add_relu_forward_train(x, z, gamma, beta, eps, saved);
  }
  CUDNN_CHECK(st);
  e.add_fused = 1;
  launch_invstd_to_var(s.backend_state[kBnInvStd].data<float>(), s.var.data<float>(), int(c), eps, compute_);
  s.backend_state[kBnReserve] = reserve;
  s.backend_state[kBnOutput] = y;
  saved = std::move(s);
  return y;
}

Tensor CudaBackend::batchnorm_add_relu_backward_impl(const Tensor& dy, const Tensor& x,
                                                     const Tensor& gamma, const Tensor& beta,
                                                     BnSaved& saved, float eps, Tensor& dgamma,
                                                     Tensor& dbeta, Tensor& dz) {
  auto& e = bn_entry(x);
  if (e.add_fused != 1 || e.f32 || !fuse_bn_add_)
    return composed_batchnorm_add_relu_backward(dy, x, gamma, beta, saved, eps, dgamma, dbeta, dz);
  check_activation(dy, "batchnorm_add_relu_backward");
  SPOTRAIN_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype() && saved.backend_state[kBnOutput].defined() &&
                     saved.backend_state[kBnInvStd].defined(),
                 "batchnorm_add_relu_backward: gradient ", dy.describe(), " does not match ",
                 x.describe(), " or the forward is missing");
  int64_t c = x.dim(1);
  Tensor dx = alloc_like(x);
  dz = alloc_like(x);
  BnArgs a = bn_args(gamma, beta, c, nullptr);
  const auto mode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
  const auto ops = CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION;
  size_t ws = 0;
  CUDNN_CHECK(cudnnGetBatchNormalizationBackwardExWorkspaceSize(
      dnn_, mode, ops, e.x, e.x, e.x, e.x, e.x, e.stats, e.act, &ws));
  const Tensor& reserve = saved.backend_state[kBnReserve];
  CUDNN_CHECK(cudnnBatchNormalizationBackwardEx(
      dnn_, mode, ops, &kOne, &kZero, &kOne, &kZero, e.x, x.raw(), e.x, saved.backend_state[kBnOutput].raw(), e.x,
      dy.raw(), e.x, dz.raw(), e.x, dx.raw(), e.stats, a.g, a.b, a.dg, a.db, double(eps),
      saved.mean.raw(), saved.backend_state[kBnInvStd].raw(), e.act, workspace(ws), ws,
      reserve.defined() ? reserve.raw() : nullptr, reserve.defined() ? reserve.nbytes() : 0));
  bn_grads_out(a, c, dgamma, dbeta);
  return dx;
}

void CudaBackend::batchnorm_update_running_impl(Tensor& running_mean, Tensor& running_var,
                                                const BnSaved& saved, float momentum, int64_t n) {
  check_device(running_mean, "batchnorm_update_running");
  double unbias = n > 1 ? double(n) / double(n - 1) : 1.0;
  launch_bn_running(running_mean.data<float>(), running_var.data<float>(), saved.mean.data<float>(),
                    saved.var.data<float>(), int(running_mean.numel()), momentum, unbias, compute_);
}

Tensor CudaBackend::batchnorm_forward_infer_impl(const Tensor& x, const Tensor& gamma,
                                                 const Tensor& beta, const Tensor& running_mean,
                                                 const Tensor& running_var, float eps, bool relu) {
  check_device(x, "batchnorm_forward_infer");
  SPOTRAIN_CHECK(x.ndim() == 4 && x.layout() == Layout::nhwc && gamma.numel() == x.dim(1),
                 "batchnorm: input ", x.describe(), " has ", x.dim(1),
                 " channels, parameters have ", gamma.numel());
  Tensor y = alloc_like(x);
  launch_bn_infer(x.raw(), y.raw(), x.dtype(), x.numel(), int(x.dim(1)), running_mean.data<float>(),
                  running_var.data<float>(), gamma.data<float>(), beta.data<float>(), eps, relu,
                  compute_);
  return y;
}


// ---- max pooling -----------------------------------------------------------------------------
// Our kernels (cuda_kernels.cu), not cuDNN's: the forward keeps each window's argmax as one
// byte (the workspace), and backward gathers dy through it, reading a quarter of the bytes
// cuDNN's backward reads (it recomputes the maxima from x and y): 1.7 ms of a ResNet-50 fp16
// step on an H200.

namespace {
PoolGeom pool_geom(const Tensor& x, const PoolParams& p) {
  SPOTRAIN_CHECK(p.k >= 1 && p.k <= 15 && p.stride >= 1 && p.pad >= 0 && p.pad < p.k,
                 "maxpool: unsupported window k=", p.k, " stride=", p.stride, " pad=", p.pad);
  PoolGeom g{int(x.dim(0)), int(x.dim(1)), int(x.dim(2)), int(x.dim(3)), 0, 0, p.k, p.stride, p.pad};
  g.oh = (g.h + 2 * p.pad - p.k) / p.stride + 1;
  g.ow = (g.w + 2 * p.pad - p.k) / p.stride + 1;
  SPOTRAIN_CHECK(g.oh > 0 && g.ow > 0, "maxpool: input ", x.describe(),
                 " is smaller than the window");
  return g;
}
}  // namespace

Tensor CudaBackend::maxpool_forward_impl(const Tensor& x, const PoolParams& p, Tensor& workspace_out) {
  check_activation(x, "maxpool");
  PoolGeom g = pool_geom(x, p);
  Tensor y = alloc({x.dim(0), x.dim(1), g.oh, g.ow}, x.dtype(), Layout::nhwc);
  Tensor idx = alloc(y.shape(), DType::u8, Layout::nhwc);
  launch_maxpool_fwd(x.raw(), y.raw(), idx.data<uint8_t>(), x.dtype(), g, compute_);
  workspace_out = idx;
  return y;
}

Tensor CudaBackend::maxpool_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& ws,
                                          const PoolParams& p) {
  check_activation(x, "maxpool_backward");
  check_activation(dy, "maxpool_backward");
  PoolGeom g = pool_geom(x, p);
  SPOTRAIN_CHECK(ws.defined() && ws.dtype() == DType::u8 && ws.shape() == dy.shape() &&
                     dy.dtype() == x.dtype() && dy.dim(2) == g.oh && dy.dim(3) == g.ow,
                 "maxpool_backward: gradient ", dy.describe(), " does not match the forward");
  Tensor dx = alloc_like(x);
  launch_maxpool_bwd(dy.raw(), ws.data<uint8_t>(), dx.raw(), x.dtype(), g, compute_);
  return dx;
}

}  // namespace spotrain::cuda
