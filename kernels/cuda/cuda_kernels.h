// Launchers of the CUDA backend's own kernels (kernels/cuda/cuda_kernels.cu). Every launcher
// queues work on `s`, checks the launch (throws Error) and returns at once; the arithmetic
// comes from kernels/elementwise.h.
// Activations are NHWC in fp32, bf16 or fp16; everything else is fp32.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace spotrain::cuda {

// One block of work of the multi-tensor SGD update: `count` elements from `offset`.
struct SgdChunk {
  int64_t offset;
  int32_t count;
  float weight_decay;
};
constexpr int kSgdChunk = 8192;
// One block of work of the LARS update: `count` elements from `offset`, of a segment whose
// chunks are [first, first + chunks) of the table; `adapt`: the segment has a trust ratio,
// from the squared norms its chunks' blocks summed (added up in chunk order, so every block
// of a segment, and every run, gets the same ratio).
struct LarsChunk {
  int64_t offset;
  int32_t count;
  float weight_decay;
  int32_t first;
  int32_t chunks;
  int32_t adapt;
  int32_t unused;
};

void launch_cast(const void* src, DType from, void* dst, DType to, int64_t n, cudaStream_t s);
// upload_pixels: dst[i] = fma(src[i], scale[c], shift[c]) in dt, c = i % channels (NHWC).
struct PixelAffine {
  float scale[3] = {1.f, 1.f, 1.f};
  float shift[3] = {0.f, 0.f, 0.f};
  int channels = 3;
};
void launch_normalize_pixels(const uint8_t* src, void* dst, DType dt, int64_t n,
                             const PixelAffine& a, cudaStream_t s);
void launch_fill_f32(float* p, float v, int64_t n, cudaStream_t s);
void launch_relu_fwd(const void* x, void* y, DType dt, int64_t n, cudaStream_t s);
void launch_relu_bwd(const void* dy, const void* y, void* dx, DType dt, int64_t n, cudaStream_t s);
void launch_add_fwd(const void* a, const void* b, void* y, DType dt, int64_t n, bool relu,
                    cudaStream_t s);
// Canonical fp32 OIHW -> (O, H, W, I) in dt, and back (the weight gradient).
void launch_oihw_to_ohwi(const float* w, void* out, DType dt, int o, int i, int h, int w_,
                         cudaStream_t s);
void launch_ohwi_to_oihw(const void* in, DType dt, float* out, int o, int i, int h, int w_,
                         cudaStream_t s);
// y = bn_infer(x) per channel (NHWC, c innermost), then ReLU when relu.
void launch_bn_infer(const void* x, void* y, DType dt, int64_t n, int c, const float* mean,
                     const float* var, const float* gamma, const float* beta, float eps, bool relu,
                     cudaStream_t s);
// The batch norm's input gradient from the coefficients cuDNN's BN_BWD_WEIGHTS graph node
// gives: dx = eq_g * g + eq_x * x + eq_bias per channel (NHWC, c innermost; g the gradient of
// the batch norm's output, x its input).
void launch_bn_bwd_apply(const void* g, const void* x, void* dx, DType dt, int64_t n, int c,
                         const float* eq_g, const float* eq_x, const float* eq_bias,
                         cudaStream_t s);
// var = 1 / invstd^2 - eps (the biased batch variance from cuDNN's saved inverse std).
void launch_invstd_to_var(const float* invstd, float* var, int c, float eps, cudaStream_t s);
// Batch-norm finalize for the fused graphs (cudnn_graph.h), in two halves. From the per-channel
// sum and sum of squares of `count` values: the batch mean, the biased variance (as training
// normalizes) and its inverse standard deviation (cuDNN's saved form, for its backward).
void launch_bn_stats_from_sums(const float* sum, const float* sqsum, int c, int64_t count,
                               float eps, float* mean, float* var, float* invstd, cudaStream_t s);
// From the batch statistics, the equivalent scale and bias, x * scale + bias = gamma * (x -
// mean) / sqrt(var + eps) + beta, stored in dt for a convolution's prologue.
void launch_bn_scale_bias(const float* mean, const float* var, const float* gamma,
                          const float* beta, int c, float eps, void* scale, void* bias, DType dt,
                          cudaStream_t s);
void launch_bn_running(float* rm, float* rv, const float* mean, const float* var, int c,
                       float momentum, double unbias, cudaStream_t s);
// Max pooling of NHWC x (n, c, h, w) with a k x k window: y (n, c, oh, ow) and idx, the
// position of each window's maximum (kh * k + kw; the first in scan order on ties), which
// backward uses to route dy: dx gathers, per input element, dy of the windows it won.
struct PoolGeom {
  int n, c, h, w, oh, ow, k, stride, pad;
};
void launch_maxpool_fwd(const void* x, void* y, uint8_t* idx, DType dt, const PoolGeom& g,
                        cudaStream_t s);
void launch_maxpool_bwd(const void* dy, const uint8_t* idx, void* dx, DType dt, const PoolGeom& g,
                        cudaStream_t s);
// Global average pool of NHWC x (n, c, hw pixels) -> y (n, c) fp32, and its backward.
void launch_gap_fwd(const void* x, DType dt, float* y, int64_t n, int64_t c, int64_t hw,
                    cudaStream_t s);
void launch_gap_bwd(const float* dy, void* dx, DType dt, int64_t n, int64_t c, int64_t hw,
                    cudaStream_t s);
// y (n, m) row i = b; db (m) = column sums of dy (n, m).
void launch_bias_rows(float* y, const float* b, int64_t n, int64_t m, cudaStream_t s);
void launch_col_sum(const float* dy, float* db, int64_t n, int64_t m, cudaStream_t s);
// The `*_dev` arguments below are null, or a device float read in place of the scalar before
// it: a captured step (CUDA Graph) reads its per-step values from memory each replay refills.
//
// Per-row softmax cross-entropy: loss[i], greater[i] (see softmax_xent_row), dz when non-null.
void launch_softmax_xent(const float* z, const int32_t* labels, const int32_t* labels_b,
                         const float* lam, int64_t n, int64_t m,
                         float smoothing, float dscale, const float* dscale_dev, float* dz,
                         double* loss, int64_t* greater, cudaStream_t s);
// skip: null, or a device flag; when it is non-zero the kernel leaves p and m untouched (a
// step whose overflow verdict the host has not read yet).
void launch_sgd(float* p, const float* g, float* m, const SgdChunk* chunks, int64_t nchunks,
                float lr, float momentum, bool nesterov, float grad_scale, const int* skip,
                const float* lr_dev, cudaStream_t s);
// LARS (kernels/elementwise.h: lars_norm_terms, lars_trust_ratio, lars_update): one kernel
// writes each adapted chunk's squared norms of p and g * grad_scale into `partial` ((nchunks,
// 2) doubles), a second sums each segment's and updates; skip and lr_dev as launch_sgd's.
void launch_lars(float* p, const float* g, float* m, const LarsChunk* chunks, int64_t nchunks,
                 double* partial, float lr, float momentum, bool nesterov, float grad_scale,
                 float eeta, float epsilon, const int* skip, const float* lr_dev, cudaStream_t s);
// g *= inv_scale; *flag = 1 if any result is inf or NaN (flag is not cleared here).
void launch_unscale_check(float* g, int64_t n, float inv_scale, const float* inv_dev, int* flag,
                          cudaStream_t s);
// d[i] = lerp_value(d[i], src[i], weight).
void launch_lerp(float* d, const float* src, int64_t n, float weight, cudaStream_t s);

}  // namespace spotrain::cuda
