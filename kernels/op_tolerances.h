// The normalized error an op may show against the float64 reference (kernels/reference/), per
// precision and kind of op, written once: the op suite's cases (health/op_cases.cpp), `spotrain
// doctor` and the fast paths' first-use checks (engine/fast_paths.h) all take their bounds here.
// Each bound is a small multiple of what accurate implementations were measured to reach
// (op_tolerances.cpp has the measurements); a kernel that computes something else misses by far.
#pragma once
#include <string>

#include "core/dtype.h"

namespace spotrain {

// How a backend under test computes, as far as its rounding goes.
enum class OpPrecision {
  fp32,       // fp32 storage and arithmetic, direct or GEMM-based convolutions (the CPU's oneDNN)
  fp32_gpu,   // fp32 with cuDNN's transform-based convolutions allowed (Winograd, FFT)
  tf32,       // fp32 storage, convolutions and Linear on TF32 tensor cores (10-bit mantissas)
  bf16,       // bf16 storage (8-bit mantissas), fp32 accumulation
  fp16,       // fp16 storage (11-bit mantissas), fp32 accumulation
};
OpPrecision op_precision(DType compute, bool tf32, bool gpu);
const char* op_precision_name(OpPrecision p);  // "fp32", "fp32 (GPU)", "tf32", "bf16", "fp16"

// What an op computes, as far as its error goes.
enum class OpKind {
  exact,                // data movement, ReLU and its mask: bit for bit
  rounding,             // one rounding to the storage dtype: Add, pooling, uploads of pixels
  conv,                 // a convolution's output (and the statistics made of it), data
                        // gradient or weight gradient
  conv_add,             // a data gradient added into a given one (conv2d_backward_data_add)
  linear,               // Linear's output and gradients (fp32 storage at every precision)
  batch_norm,           // batch norm's output and statistics, running statistics, inference,
                        // relu(bn(x) + z)
  batch_norm_backward,  // batch norm's gradients (dx, dgamma, dbeta), also through Add + ReLU
  fused_forward,        // a convolution applying a batch norm + ReLU as it reads (and the
                        // statistics of its output)
  fused_weights,        // conv2d_backward_bn_relu's weight gradient
  fused_backward,       // conv2d_backward_bn_relu's input, gamma and beta gradients
  fp32_reduction,       // an fp32 mean of many stored inputs: global average pooling
  fp32_update,          // fp32 elementwise chains: SGD and LARS steps, lerp, the loss's gradient
  loss_value,           // the mean loss (a double; relative error)
};
const char* op_kind_name(OpKind k);

// The normalized error ||got - want|| / ||want|| allowed for `kind` at `precision`, `want`
// from the float64 reference on the same (rounded) inputs.
double op_tolerance(OpKind kind, OpPrecision precision);

}  // namespace spotrain
