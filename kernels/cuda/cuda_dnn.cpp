// CUDA backend: cuDNN convolution (forward, backward-data, backward-filter; algorithm chosen
// once per shape by measurement, or by cuDNN's heuristics restricted to deterministic
// algorithms under --deterministic), batch norm for training (the Ex API, fused ReLU where
// cuDNN supports it for the shape and dtype, else our ReLU kernel; fused Add + ReLU for a
// residual block's last BN), and max pooling (our kernels). cuDNN 9 still ships these legacy
// entry points (deprecated in favour of the graph API).
#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "kernels/cuda/cuda_entries.h"
#include "kernels/cuda/cuda_util.h"

namespace spotrain::cuda {

// BnSaved::backend_state slots: cuDNN's reserve space, its saved inverse standard deviation,
// and (with a ReLU) the forward output for the mask: the same slot as the composed default.
constexpr int kBnReserve = 0, kBnInvStd = 1, kBnOutput = BnSaved::kComposedOutput;

namespace {

cudnnDataType_t dnn_dtype(DType d) {
  switch (d) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      SPOTRAIN_THROW("cuDNN: unsupported dtype ", dtype_name(d));
  }
}

void check_activation(const Tensor& x, const char* op) {
  SPOTRAIN_CHECK(
      x.defined() && x.device() == Device::cuda && x.ndim() == 4 && x.layout() == Layout::nhwc &&
          (x.dtype() == DType::f32 || x.dtype() == DType::bf16 || x.dtype() == DType::f16),
      op, ": expected an NHWC activation on the GPU, got ",
      x.defined() ? x.describe() : std::string("an undefined tensor"));
}

std::string key_of(const Tensor& t) {
  std::string k = dtype_name(t.dtype());
  for (auto d : t.shape()) k += "," + std::to_string(d);
  return k;
}

cudnnTensorDescriptor_t nhwc_desc(DType dt, int64_t n, int64_t c, int64_t h, int64_t w) {
  cudnnTensorDescriptor_t d;
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NHWC, dnn_dtype(dt), int(n), int(c),
                                         int(h), int(w)));
  return d;
}

const float kOne = 1.f, kZero = 0.f;

// Picks an algorithm from perf results (sorted best first): the first that ran, fits the
// workspace limit, is deterministic when asked, and (strict fp32) does not use tensor cores.
template <typename Perf>
const Perf* pick(const Perf* perf, int count, size_t limit, bool deterministic, bool strict) {
  for (int i = 0; i < count; ++i) {
    const Perf& r = perf[i];
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > limit) continue;
    if (deterministic && r.determinism != CUDNN_DETERMINISTIC) continue;
    if (strict &&
        (r.mathType == CUDNN_TENSOR_OP_MATH || r.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
      continue;
    return &r;
  }
  return nullptr;
}

size_t workspace_limit() {
  size_t free_b = 0, total = 0;
  if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) return size_t(256) << 20;
  return std::min(free_b / 4, size_t(2) << 30);
}

// Chooses an algorithm: under --deterministic, cuDNN's heuristics (the same choice every run);
// otherwise by measurement (FindEx) with a workspace as large as the best candidates need.
// get_v7(n, &returned, perf) and find_ex(n, &returned, perf, ws, ws_bytes) wrap the calls.
template <typename Perf, int kCount, typename GetV7, typename FindEx>
Perf choose_algo(bool deterministic, bool strict, const char* what, GetV7 get_v7, FindEx find_ex) {
  // Room for more results than the enum names: newer cuDNN builds may report extra entries.
  constexpr int kRoom = 2 * kCount + 8;
  Perf perf[kRoom];
  int got = 0;
  size_t limit = workspace_limit();
  CUDNN_CHECK(get_v7(kRoom, &got, perf));
  if (!deterministic) {
    size_t want = 0;
    for (int i = 0; i < got; ++i)
      if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= limit)
        want = std::max(want, perf[i].memory);
    void* ws = nullptr;
    // A transient buffer outside the caching allocator: measured once per shape.
    if (want > 0 && cudaMalloc(&ws, want) != cudaSuccess) {
      (void)cudaGetLastError();
      ws = nullptr;
      want = 0;
    }
    Perf found[kRoom];
    int nfound = 0;
    cudnnStatus_t st = find_ex(kRoom, &nfound, found, ws, want);
    if (ws) (void)cudaFree(ws);
    CUDNN_CHECK(st);
    if (const Perf* r = pick(found, nfound, want, false, strict)) return *r;
  }
  if (const Perf* r = pick(perf, got, limit, deterministic, strict)) return *r;
  // No deterministic algorithm for this shape (some NHWC directions have only
  // non-deterministic kernels): run, and say once that this shape breaks bitwise repeatability.
  if (deterministic) {
    if (const Perf* r = pick(perf, got, limit, false, strict)) {
      static bool said = false;
      if (!said)
        std::fprintf(stderr,
                     "warning: cuDNN has no deterministic %s algorithm for a shape of this model; "
                     "it uses a non-deterministic one (runs may differ in the last bits)\n",
                     what);
      said = true;
      return *r;
    }
  }
  SPOTRAIN_THROW("cuDNN offers no ", deterministic ? "deterministic " : "", what,
                 " algorithm for this shape", strict ? " in strict fp32" : "",
                 deterministic ? "; try without --deterministic" : "");
}

// A bf16/fp16 convolution direction without a cuDNN algorithm (e.g. a stem with 1 or 3 input
// channels on some cuDNN builds): say so once; the caller computes it in fp32 instead.
void note_f32_fallback(const char* what, const Tensor& x, const Error& err) {
  std::fprintf(stderr, "note: convolution %s on %s runs in fp32: %s\n", what, x.describe().c_str(),
               err.what());
}

}  // namespace

// ---- convolution ----------------------------------------------------------------------------

cudnnMathType_t CudaBackend::conv_math(DType dt) const {
  if (dt != DType::f32) return CUDNN_TENSOR_OP_MATH;
  // fp32: FMA only (no TF32) unless tf32 was asked for; DEFAULT_MATH lets cuDNN use TF32
  // tensor cores on Ampere and later but never converts to fp16/bf16.
  return opt_.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

// Choosing algorithms runs and times kernels, which a step being recorded cannot do: the
// eager steps before a capture (StepRunner's warm-up) meet every shape first.
constexpr const char* kNewShapeWhileCapturing =
    "internal: a convolution shape first met while capturing a step (--cuda-graph)";

CudaBackend::ConvEntry& CudaBackend::conv_entry(const Tensor& x, const Tensor& w,
                                                const ConvParams& p) {
  std::string key =
      key_of(x) + "|" + key_of(w) + "|" + std::to_string(p.stride) + "," + std::to_string(p.pad);
  auto it = conv_cache_.find(key);
  if (it != conv_cache_.end()) return *it->second;
  SPOTRAIN_CHECK(!capturing_, kNewShapeWhileCapturing);
  SPOTRAIN_CHECK(w.ndim() == 4 && w.dim(1) == x.dim(1) && w.dim(2) == p.kh && w.dim(3) == p.kw,
                 "conv2d: input ", x.describe(), " does not match weights ", w.describe());
  auto e = std::make_unique<ConvEntry>();
  DType dt = x.dtype();
  e->x = nhwc_desc(dt, x.dim(0), x.dim(1), x.dim(2), x.dim(3));
  CUDNN_CHECK(cudnnCreateFilterDescriptor(&e->w));
  CUDNN_CHECK(cudnnSetFilter4dDescriptor(e->w, dnn_dtype(dt), CUDNN_TENSOR_NHWC, int(w.dim(0)),
                                         int(w.dim(1)), int(w.dim(2)), int(w.dim(3))));
  CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&e->conv));
  CUDNN_CHECK(cudnnSetConvolution2dDescriptor(e->conv, p.pad, p.pad, p.stride, p.stride, 1, 1,
                                              CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CUDNN_CHECK(cudnnSetConvolutionMathType(e->conv, conv_math(dt)));
  int n = 0, c = 0, h = 0, wd = 0;
  CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(e->conv, e->x, e->w, &n, &c, &h, &wd));
  SPOTRAIN_CHECK(h > 0 && wd > 0, "conv2d: input ", x.describe(), " is smaller than the kernel");
  e->oh = h;
  e->ow = wd;
  e->y = nhwc_desc(dt, n, c, h, wd);
  auto& ref = *e;
  conv_cache_.emplace(key, std::move(e));
  return ref;
}

const void* CudaBackend::weights_as(const Tensor& w, DType dt) {
  SPOTRAIN_CHECK(w.dtype() == DType::f32 && w.ndim() == 4 && w.device() == Device::cuda,
                 "conv2d: weights must be fp32 OIHW on the GPU, got ", w.describe());
  auto& copies = weight_copies_[w.raw()];
  WeightCopy* wc = nullptr;
  for (auto& c : copies)
    if (c.dt == dt && c.data.shape() == w.shape()) wc = &c;
  if (!wc) {  // (a same-address copy of another shape belonged to a freed tensor)
    copies.erase(std::remove_if(copies.begin(), copies.end(),
                                [&](const WeightCopy& c) { return c.dt == dt; }),
                 copies.end());
    copies.push_back(WeightCopy{dt, Tensor(w.shape(), dt, allocator(), Layout::nhwc), 0});
    wc = &copies.back();
  }
  if (wc->version != w.version()) {
    launch_oihw_to_ohwi(w.data<float>(), wc->data.raw(), dt, int(w.dim(0)), int(w.dim(1)),
                        int(w.dim(2)), int(w.dim(3)), compute_);
    wc->version = w.version();
  }
  return wc->data.raw();
}

Tensor CudaBackend::conv2d_forward(const Tensor& x, const Tensor& w, const ConvParams& p) {
  check_activation(x, "conv2d");
  auto& e = conv_entry(x, w, p);
  if (e.fwd_f32) return cast(conv2d_forward(cast(x, DType::f32), w, p), x.dtype());
  const void* wp = weights_as(w, x.dtype());
  Tensor y = alloc({x.dim(0), w.dim(0), e.oh, e.ow}, x.dtype(), Layout::nhwc);
  bool strict = x.dtype() == DType::f32 && !opt_.tf32;
  if (!e.have_fwd) {
    SPOTRAIN_CHECK(!capturing_, kNewShapeWhileCapturing);
    try {
      CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, conv_math(x.dtype())));
      auto r = choose_algo<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT>(
          opt_.deterministic, strict, "convolution forward",
          [&](int n, int* got, cudnnConvolutionFwdAlgoPerf_t* perf) {
            return cudnnGetConvolutionForwardAlgorithm_v7(dnn_, e.x, e.w, e.conv, e.y, n, got,
                                                          perf);
          },
          [&](int n, int* got, cudnnConvolutionFwdAlgoPerf_t* perf, void* ws, size_t bytes) {
            return cudnnFindConvolutionForwardAlgorithmEx(dnn_, e.x, x.raw(), e.w, wp, e.conv, e.y,
                                                          y.raw(), n, got, perf, ws, bytes);
          });
      e.fwd_algo = r.algo;
      e.fwd_math = strict ? CUDNN_FMA_MATH : r.mathType;
      CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, e.fwd_math));
      CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(dnn_, e.x, e.w, e.conv, e.y, e.fwd_algo,
                                                          &e.fwd_ws));
      e.have_fwd = true;
    } catch (const Error& err) {
      if (x.dtype() == DType::f32) throw;
      note_f32_fallback("forward", x, err);
      e.fwd_f32 = true;
      return cast(conv2d_forward(cast(x, DType::f32), w, p), x.dtype());
    }
  }
  CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, e.fwd_math));
  CUDNN_CHECK(cudnnConvolutionForward(dnn_, &kOne, e.x, x.raw(), e.w, wp, e.conv, e.fwd_algo,
                                      workspace(e.fwd_ws), e.fwd_ws, &kZero, e.y, y.raw()));
  return y;
}

bool CudaBackend::backward_data_into(const Tensor& dy, const Tensor& w, const Tensor& x,
                                     const ConvParams& p, Tensor& dx, float beta) {
  check_activation(x, "conv2d_backward_data");
  check_activation(dy, "conv2d_backward_data");
  auto& e = conv_entry(x, w, p);
  SPOTRAIN_CHECK(dy.dtype() == x.dtype() && dy.dim(0) == x.dim(0) && dy.dim(1) == w.dim(0) &&
                     dy.dim(2) == e.oh && dy.dim(3) == e.ow,
                 "conv2d_backward_data: gradient ", dy.describe(), " does not match the output");
  if (e.bd_f32) return false;
  const void* wp = weights_as(w, x.dtype());
  bool strict = x.dtype() == DType::f32 && !opt_.tf32;
  if (!e.have_bd) {
    SPOTRAIN_CHECK(!capturing_, kNewShapeWhileCapturing);
    // The search writes its trial results into a buffer of dx's size: not into dx itself when
    // dx holds a gradient to add to.
    Tensor trial = beta != 0.f ? alloc_like(x) : dx;
    try {
      CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, conv_math(x.dtype())));
      auto r =
          choose_algo<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT>(
              opt_.deterministic, strict, "convolution backward-data",
              [&](int n, int* got, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
                return cudnnGetConvolutionBackwardDataAlgorithm_v7(dnn_, e.w, e.y, e.conv, e.x, n,
                                                                   got, perf);
              },
              [&](int n, int* got, cudnnConvolutionBwdDataAlgoPerf_t* perf, void* ws,
                  size_t bytes) {
                return cudnnFindConvolutionBackwardDataAlgorithmEx(
                    dnn_, e.w, wp, e.y, dy.raw(), e.conv, e.x, trial.raw(), n, got, perf, ws,
                    bytes);
              });
      e.bd_algo = r.algo;
      e.bd_math = strict ? CUDNN_FMA_MATH : r.mathType;
      CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, e.bd_math));
      CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(dnn_, e.w, e.y, e.conv, e.x,
                                                               e.bd_algo, &e.bd_ws));
      e.have_bd = true;
    } catch (const Error& err) {
      if (x.dtype() == DType::f32) throw;
      note_f32_fallback("backward-data", x, err);
      e.bd_f32 = true;
      return false;
    }
  }
  CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, e.bd_math));
  CUDNN_CHECK(cudnnConvolutionBackwardData(dnn_, &kOne, e.w, wp, e.y, dy.raw(), e.conv, e.bd_algo,
                                           workspace(e.bd_ws), e.bd_ws,
                                           beta != 0.f ? &kOne : &kZero, e.x, dx.raw()));
  return true;
}

Tensor CudaBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, const Tensor& x,
                                         const ConvParams& p) {
  Tensor dx = alloc_like(x);
  if (backward_data_into(dy, w, x, p, dx, 0.f)) return dx;
  return cast(conv2d_backward_data(cast(dy, DType::f32), w, cast(x, DType::f32), p), x.dtype());
}

void CudaBackend::conv2d_backward_data_add(const Tensor& dy, const Tensor& w, const Tensor& x,
                                           const ConvParams& p, Tensor& acc) {
  check_activation(acc, "conv2d_backward_data_add");
  SPOTRAIN_CHECK(acc.shape() == x.shape() && acc.dtype() == x.dtype(),
                 "conv2d_backward_data_add: gradient ", acc.describe(), " does not match the input ",
                 x.describe());
  if (!backward_data_into(dy, w, x, p, acc, 1.f))  // this shape runs in fp32: compose
    Backend::conv2d_backward_data_add(dy, w, x, p, acc);
}

void CudaBackend::conv2d_backward_weights(const Tensor& x, const Tensor& dy, const ConvParams& p,
                                          Tensor& dw) {
  check_activation(x, "conv2d_backward_weights");
  check_activation(dy, "conv2d_backward_weights");
  SPOTRAIN_CHECK(dw.dtype() == DType::f32 && dw.ndim() == 4 && dw.device() == Device::cuda,
                 "conv2d: weight gradient must be fp32 OIHW on the GPU, got ", dw.describe());
  auto& e = conv_entry(x, dw, p);
  SPOTRAIN_CHECK(dy.dtype() == x.dtype() && dy.dim(0) == x.dim(0) && dy.dim(1) == dw.dim(0) &&
                     dy.dim(2) == e.oh && dy.dim(3) == e.ow,
                 "conv2d_backward_weights: gradient ", dy.describe(), " does not match the output");
  if (e.bw_f32) return conv2d_backward_weights(cast(x, DType::f32), cast(dy, DType::f32), p, dw);
  // cuDNN writes the gradient in the filter's (O, H, W, I) layout and the compute dtype; our
  // kernel then transposes it into the fp32 OIHW gradient.
  Tensor tmp(dw.shape(), x.dtype(), allocator(), Layout::nhwc);
  bool strict = x.dtype() == DType::f32 && !opt_.tf32;
  if (!e.have_bw) {
    SPOTRAIN_CHECK(!capturing_, kNewShapeWhileCapturing);
    try {
      CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, conv_math(x.dtype())));
      auto r =
          choose_algo<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT>(
              opt_.deterministic, strict, "convolution backward-filter",
              [&](int n, int* got, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
                return cudnnGetConvolutionBackwardFilterAlgorithm_v7(dnn_, e.x, e.y, e.conv, e.w, n,
                                                                     got, perf);
              },
              [&](int n, int* got, cudnnConvolutionBwdFilterAlgoPerf_t* perf, void* ws,
                  size_t bytes) {
                return cudnnFindConvolutionBackwardFilterAlgorithmEx(
                    dnn_, e.x, x.raw(), e.y, dy.raw(), e.conv, e.w, tmp.raw(), n, got, perf, ws,
                    bytes);
              });
      e.bw_algo = r.algo;
      e.bw_math = strict ? CUDNN_FMA_MATH : r.mathType;
      CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, e.bw_math));
      CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn_, e.x, e.y, e.conv, e.w,
                                                                 e.bw_algo, &e.bw_ws));
      e.have_bw = true;
    } catch (const Error& err) {
      if (x.dtype() == DType::f32) throw;
      note_f32_fallback("backward-filter", x, err);
      e.bw_f32 = true;
      return conv2d_backward_weights(cast(x, DType::f32), cast(dy, DType::f32), p, dw);
    }
  }
  CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, e.bw_math));
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(dnn_, &kOne, e.x, x.raw(), e.y, dy.raw(), e.conv,
                                             e.bw_algo, workspace(e.bw_ws), e.bw_ws, &kZero, e.w,
                                             tmp.raw()));
  launch_ohwi_to_oihw(tmp.raw(), x.dtype(), dw.data<float>(), int(dw.dim(0)), int(dw.dim(1)),
                      int(dw.dim(2)), int(dw.dim(3)), compute_);
}

// ---- batch norm ------------------------------------------------------------------------------

namespace {
struct BnConfig {
  cudnnBatchNormMode_t mode;
  cudnnBatchNormOps_t ops;
};
// Tried in order at the first use of a shape; the first cuDNN accepts is kept. With ReLU the
// search starts at 0 (fused), without at 1.
const BnConfig kBnConfigs[] = {
    {CUDNN_BATCHNORM_SPATIAL_PERSISTENT, CUDNN_BATCHNORM_OPS_BN_ACTIVATION},
    {CUDNN_BATCHNORM_SPATIAL_PERSISTENT, CUDNN_BATCHNORM_OPS_BN},
    {CUDNN_BATCHNORM_SPATIAL, CUDNN_BATCHNORM_OPS_BN},
};
constexpr int kNumBnConfigs = 3;
}  // namespace

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

Tensor CudaBackend::batchnorm_forward_train(const Tensor& x, const Tensor& gamma,
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

Tensor CudaBackend::batchnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
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
  int chosen = e.cfg[relu ? 1 : 0];
  SPOTRAIN_CHECK(chosen >= 0 && saved.backend_state[kBnInvStd].defined() && (!relu || saved.backend_state[kBnOutput].defined()),
                 "internal: batch-norm backward without its training forward");
  const BnConfig& cf = kBnConfigs[chosen];
  bool fused = cf.ops == CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
  cudnnActivationDescriptor_t act = fused ? e.act : nullptr;
  Tensor g = relu && !fused ? relu_backward(dy, saved.backend_state[kBnOutput]) : dy;
  int64_t c = x.dim(1);
  Tensor dx = alloc_like(x);
  BnArgs a = bn_args(gamma, beta, c, nullptr);
  size_t ws = 0;
  CUDNN_CHECK(cudnnGetBatchNormalizationBackwardExWorkspaceSize(
      dnn_, cf.mode, cf.ops, e.x, fused ? e.x : nullptr, e.x, nullptr, e.x, e.stats, act, &ws));
  const Tensor& reserve = saved.backend_state[kBnReserve];
  CUDNN_CHECK(cudnnBatchNormalizationBackwardEx(
      dnn_, cf.mode, cf.ops, &kOne, &kZero, &kOne, &kZero, e.x, x.raw(), fused ? e.x : nullptr,
      fused ? saved.backend_state[kBnOutput].raw() : nullptr, e.x, g.raw(), nullptr, nullptr, e.x, dx.raw(), e.stats,
      a.g, a.b, a.dg, a.db, double(eps), saved.mean.raw(), saved.backend_state[kBnInvStd].raw(), act, workspace(ws), ws,
      reserve.defined() ? reserve.raw() : nullptr, reserve.defined() ? reserve.nbytes() : 0));
  bn_grads_out(a, c, dgamma, dbeta);
  return dx;
}

// relu(bn(x) + z) in one cuDNN call (CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION, persistent NHWC
// kernels): the block's Add and ReLU never touch memory on their own. Where cuDNN refuses the
// shape or dtype at its first use, the op is composed of BN and Add from then on.
Tensor CudaBackend::batchnorm_add_relu_forward_train(const Tensor& x, const Tensor& z,
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
    return Backend::batchnorm_add_relu_forward_train(x, z, gamma, beta, eps, saved);
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
    return Backend::batchnorm_add_relu_forward_train(x, z, gamma, beta, eps, saved);
  }
  CUDNN_CHECK(st);
  e.add_fused = 1;
  launch_invstd_to_var(s.backend_state[kBnInvStd].data<float>(), s.var.data<float>(), int(c), eps, compute_);
  s.backend_state[kBnReserve] = reserve;
  s.backend_state[kBnOutput] = y;
  saved = std::move(s);
  return y;
}

Tensor CudaBackend::batchnorm_add_relu_backward(const Tensor& dy, const Tensor& x,
                                                const Tensor& gamma, const Tensor& beta,
                                                const BnSaved& saved, float eps, Tensor& dgamma,
                                                Tensor& dbeta, Tensor& dz) {
  auto& e = bn_entry(x);
  if (e.add_fused != 1 || e.f32 || !fuse_bn_add_)
    return Backend::batchnorm_add_relu_backward(dy, x, gamma, beta, saved, eps, dgamma, dbeta, dz);
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

Tensor CudaBackend::maxpool_forward(const Tensor& x, const PoolParams& p, Tensor& workspace_out) {
  check_activation(x, "maxpool");
  PoolGeom g = pool_geom(x, p);
  Tensor y = alloc({x.dim(0), x.dim(1), g.oh, g.ow}, x.dtype(), Layout::nhwc);
  Tensor idx = alloc(y.shape(), DType::u8, Layout::nhwc);
  launch_maxpool_fwd(x.raw(), y.raw(), idx.data<uint8_t>(), x.dtype(), g, compute_);
  workspace_out = idx;
  return y;
}

Tensor CudaBackend::maxpool_backward(const Tensor& dy, const Tensor& x, const Tensor& ws,
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

// Here, where the cache entries are complete types.
CudaBackend::~CudaBackend() {
  // No throwing here: report and go on.
  drop_capture();
  if (graph_in_copied_) CUDA_WARN(cudaEventDestroy(graph_in_copied_));
  if (compute_) CUDA_WARN(cudaStreamSynchronize(compute_));
  if (copy_) CUDA_WARN(cudaStreamSynchronize(copy_));
  for (auto& u : pinned_uploads_) free_events_.push_back(u.copied);
  pinned_uploads_.clear();  // every copy is done: the sources may go back to the loader
  for (cudaEvent_t ev : free_events_) CUDA_WARN(cudaEventDestroy(ev));
  free_events_.clear();
  for (cudaEvent_t ev : marks_) CUDA_WARN(cudaEventDestroy(ev));
  marks_.clear();
  if (loss_ready_) CUDA_WARN(cudaEventDestroy(loss_ready_));
  if (overflow_ready_) CUDA_WARN(cudaEventDestroy(overflow_ready_));
  loss_host_ = Tensor();
  overflow_flag_ = Tensor();
  overflow_host_ = Tensor();
  conv_cache_.clear();
  bn_cache_.clear();
  weight_copies_.clear();
  workspace_ = Tensor();
  sgd_chunks_ = Tensor();
  if (pinned_) CUDA_WARN(cudaFreeHost(pinned_));
  if (blas_) CUBLAS_WARN(blas::destroy(blas_));
  if (dnn_) CUDNN_WARN(cudnnDestroy(dnn_));
  for (auto& st : staging_) {
    if (st.host) CUDA_WARN(cudaFreeHost(st.host));
    if (st.copied) CUDA_WARN(cudaEventDestroy(st.copied));
  }
  if (compute_mark_) CUDA_WARN(cudaEventDestroy(compute_mark_));
  if (copy_) CUDA_WARN(cudaStreamDestroy(copy_));
  if (compute_) CUDA_WARN(cudaStreamDestroy(compute_));
}

}  // namespace spotrain::cuda
