// Entry points of the CUDA backend. This build compiles and links the CUDA target (so the
// toolchain plumbing is exercised in CI); the cuDNN/cuBLAS backend itself is issue 7 and
// is not implemented yet, so asking for --device cuda fails with a clear message.
#include <memory>

#include "engine/error.h"
#include "kernels/ops.h"

#include <string>

#include "engine/error.h"

#ifdef SPOTRAIN_WITH_CUDA
#include <cuda_runtime.h>
#include <cudnn_version.h>
#include <nccl.h>
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

// The GPU side of the machine for `spotrain bench`: device 0's name and count, driver and
// runtime versions, and the cuDNN / NCCL versions this build was compiled against.
std::string cuda_machine_description() {
#ifdef SPOTRAIN_WITH_CUDA
  int rt = 0, drv = 0, n = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  auto ver = [](int v) { return str(v / 1000, ".", (v % 1000) / 10); };
  std::string libs = str("CUDA runtime ", ver(rt), ", cuDNN ", CUDNN_MAJOR, ".", CUDNN_MINOR, ".",
                         CUDNN_PATCHLEVEL, ", NCCL ", NCCL_MAJOR, ".", NCCL_MINOR, ".", NCCL_PATCH);
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return str("no GPU visible; ", libs);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  return str(n, " x ", prop.name, " (", prop.totalGlobalMem >> 20, " MiB), driver ", ver(drv), "; ", libs);
#else
  return "no GPU (built without CUDA)";
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
