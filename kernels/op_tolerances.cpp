// The tolerance table (see op_tolerances.h) with what it rests on: the worst normalized error
// the op suite's cases measured against the float64 reference, and the unit roundoff u of each
// storage type (fp32 2^-24 = 6.0e-8, fp16 2^-11 = 4.9e-4, bf16 2^-8 = 3.9e-3).
#include "kernels/op_tolerances.h"

#include "core/error.h"

namespace spotrain {

OpPrecision op_precision(DType compute, bool tf32, bool gpu) {
  if (compute == DType::bf16) return OpPrecision::bf16;
  if (compute == DType::f16) return OpPrecision::fp16;
  SPOTRAIN_CHECK(compute == DType::f32, "no op tolerance for compute dtype ", dtype_name(compute));
  if (tf32 && gpu) return OpPrecision::tf32;
  return gpu ? OpPrecision::fp32_gpu : OpPrecision::fp32;
}

const char* op_precision_name(OpPrecision p) {
  switch (p) {
    case OpPrecision::fp32: return "fp32";
    case OpPrecision::fp32_gpu: return "fp32 (GPU)";
    case OpPrecision::tf32: return "tf32";
    case OpPrecision::bf16: return "bf16";
    case OpPrecision::fp16: return "fp16";
  }
  return "?";
}

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::exact: return "exact";
    case OpKind::rounding: return "rounding";
    case OpKind::conv: return "conv";
    case OpKind::conv_add: return "conv_add";
    case OpKind::linear: return "linear";
    case OpKind::batch_norm: return "batch_norm";
    case OpKind::batch_norm_backward: return "batch_norm_backward";
    case OpKind::fused_forward: return "fused_forward";
    case OpKind::fused_weights: return "fused_weights";
    case OpKind::fused_backward: return "fused_backward";
    case OpKind::fp32_reduction: return "fp32_reduction";
    case OpKind::fp32_update: return "fp32_update";
    case OpKind::loss_value: return "loss_value";
  }
  return "?";
}

namespace {

// One row per precision, one column per kind (in OpKind's order). Measured on the CPU targets
// (2026-12-06, oneDNN 2.6.3, 2 threads; blocked and NHWC alike), the worst over every case:
//   fp32: conv 2.1e-7, Linear 1.1e-7, batch norm 4.7e-7 and its backward 1.2e-6, the fused
//         forward 4.6e-7, weights 3.4e-7 and backward 1.1e-6, one rounding 5.3e-8, an fp32 mean
//         9.1e-8, optimizer steps and the loss gradient 6.0e-8, the loss 3.5e-8 (the
//         backends' fp32 label-smoothing targets, where the reference's are exact).
//   bf16: one rounding 2.2e-3 (0.56 u, as uniform rounding gives), conv 3.2e-3 (its weights
//         rounded too), batch norm 2.3e-3, its backward 6.1e-3, fused forward 3.6e-3, weights
//         2.7e-3, backward 5.0e-2 (dbeta: a channel's sum of bf16-rounded gradients that nearly
//         cancel, in the shifted-mean case).
//   fp16: one rounding 2.7e-4, conv 3.2e-4, batch norm 2.4e-4, its backward 6.8e-4, fused
//         forward 3.9e-4, weights 2.8e-4, backward 1.2e-2 (dbeta, as at bf16).
// Each bound is 3 to 5 times that (the 16-bit fused ops more: a GPU's fused graphs round the
// prologue's scale and bias to fp16, where the CPU composes in fp32). Not measured on a GPU: the
// fp32 (GPU) and tf32 rows keep the bounds the CUDA backend held on the H200 run of 2026-12-04
// (cuDNN's Winograd and FFT convolutions; TF32's 10-bit mantissas); a GPU run that measures them
// should tighten these, as the CPU's were.
constexpr int kKinds = int(OpKind::loss_value) + 1;
//                                 exact  round   conv    conv_add linear  bn      bn_bwd  fused_f fused_w fused_b red   update loss
constexpr double kFp32[kKinds] =    {0,   3e-7,   1e-6,   1e-6,    1e-6,   2e-6,   5e-6,   2e-6,   2e-6,   5e-6,   1e-6, 5e-7, 1e-7};
constexpr double kFp32Gpu[kKinds] = {0,   3e-7,   1e-4,   1e-4,    1e-5,   1e-4,   2e-4,   2e-4,   2e-4,   4e-4,   1e-6, 5e-7, 1e-7};
constexpr double kTf32[kKinds] =    {0,   3e-7,   5e-3,   5e-3,    5e-3,   5e-3,   1e-2,   1e-2,   1e-2,   2e-2,   1e-6, 5e-7, 1e-7};
constexpr double kBf16[kKinds] =    {0,   5e-3,   1e-2,   1e-2,    1e-5,   1e-2,   2e-2,   2e-2,   2e-2,   1.5e-1, 1e-6, 5e-7, 1e-7};
constexpr double kFp16[kKinds] =    {0,   6e-4,   1.5e-3, 1.5e-3,  1e-5,   1.5e-3, 3e-3,   5e-3,   5e-3,   4e-2,   1e-6, 5e-7, 1e-7};

}  // namespace

double op_tolerance(OpKind kind, OpPrecision precision) {
  const double* row = precision == OpPrecision::fp32       ? kFp32
                      : precision == OpPrecision::fp32_gpu ? kFp32Gpu
                      : precision == OpPrecision::tf32     ? kTf32
                      : precision == OpPrecision::bf16     ? kBf16
                                                           : kFp16;
  return row[int(kind)];
}

}  // namespace spotrain
