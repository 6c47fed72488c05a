// Entry points of the CUDA backend. This build compiles and links the CUDA target (so the
// toolchain plumbing is exercised in CI); the cuDNN/cuBLAS backend itself is issue 7 and
// is not implemented yet, so asking for --device cuda fails with a clear message.
#include <memory>

#include "engine/error.h"
#include "kernels/ops.h"

#ifdef SPOTRAIN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace spotrain {

bool cuda_device_available() {
#ifdef SPOTRAIN_WITH_CUDA
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

// Whether this build can train on a GPU; --device auto uses the GPU only then.
bool cuda_backend_ready() { return false; }

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&) {
#ifdef SPOTRAIN_WITH_CUDA
  SPOTRAIN_THROW("--device cuda: the CUDA backend is not implemented in this version yet; "
                 "use --device cpu");
#else
  SPOTRAIN_THROW("--device cuda: this build has no CUDA support (configure with "
                 "-DSPOTRAIN_CUDA=ON on a machine with nvcc); use --device cpu");
#endif
}

}  // namespace spotrain
