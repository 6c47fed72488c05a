// The precision policy: --precision fp32|tf32|bf16|fp16 decides the compute dtype of
// activations and of the backend's weight copies. Master weights, weight gradients, the
// optimizer, BN parameters and statistics, the classifier and the loss always stay fp32.
#pragma once
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace spotrain {

enum class Precision { fp32, tf32, bf16, fp16 };

inline Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::fp32;
  if (s == "tf32") return Precision::tf32;
  if (s == "bf16") return Precision::bf16;
  if (s == "fp16") return Precision::fp16;
  SPOTRAIN_THROW("unknown --precision '", s, "'; use fp32, tf32, bf16 or fp16");
}

inline DType compute_dtype(Precision p) {
  switch (p) {
    case Precision::bf16: return DType::bf16;
    case Precision::fp16: return DType::f16;
    default: return DType::f32;  // tf32 is a GPU math mode over fp32 storage
  }
}

}  // namespace spotrain
