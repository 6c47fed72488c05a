// Entry points of the CUDA backend: whether a device is present, and make_cuda_backend.
// Without CUDA support in the build, --device cuda fails with a clear message.
#include <memory>
#include <string>

#include "engine/error.h"
#include "kernels/ops.h"

#ifdef SPOTRAIN_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_backend.h"
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
bool cuda_backend_ready() {
#ifdef SPOTRAIN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opt) {
#ifdef SPOTRAIN_WITH_CUDA
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0)
    SPOTRAIN_THROW("--device cuda: no CUDA device (",
                   e == cudaSuccess ? "none found" : cudaGetErrorString(e), "); use --device cpu");
  return std::make_unique<cuda::CudaBackend>(opt);
#else
  (void)opt;
  SPOTRAIN_THROW(
      "--device cuda: this build has no CUDA support (configure with "
      "-DSPOTRAIN_CUDA=ON on a machine with nvcc); use --device cpu");
#endif
}

}  // namespace spotrain
