// Elementwise math written once for both backends: the CPU loops and the CUDA kernels call
// these, so the CPU tests cover the arithmetic the GPU runs.
#pragma once
#include <cmath>

#include "engine/philox.h"  // SPOTRAIN_HD

namespace spotrain {

// One SGD step for one element, PyTorch's torch.optim.SGD semantics:
//   g = grad * grad_scale + wd * p;  m = momentum * m + g;  p -= lr * (nesterov ? g + momentum * m : m)
// Momentum buffers start at zero, so the first step's m is g, exactly as PyTorch's.
SPOTRAIN_HD void sgd_update(float& p, float grad, float& m, float lr, float momentum,
                            float wd, bool nesterov, float grad_scale) {
  float g = grad * grad_scale + wd * p;
  m = momentum * m + g;
  float d = nesterov ? g + momentum * m : m;
  p -= lr * d;
}

SPOTRAIN_HD float relu_fwd(float x) { return x > 0.f ? x : 0.f; }
SPOTRAIN_HD float relu_bwd(float dy, float y) { return y > 0.f ? dy : 0.f; }

}  // namespace spotrain
