// Entry points of the CUDA backend for the backend factory (kernels/backend_factory.cpp):
// whether a device is present, and make_cuda_backend; and what the backend says of its device
// (kernels/device_info.h). Compiled only into CUDA builds.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>

#include "core/error.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/device_info.h"
#include "kernels/ops.h"

namespace spotrain {

bool cuda_device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opt) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0)
    SPOTRAIN_THROW("--device cuda: no CUDA device (",
                   e == cudaSuccess ? "none found" : cudaGetErrorString(e), "); use --device cpu");
  return std::make_unique<cuda::CudaBackend>(opt);
}

std::string cuda::CudaBackend::gpu_pci_bus_id() const { return current_gpu_pci_bus_id(); }

std::string cuda::CudaBackend::device_line() const { return gpu_info_line(gpu_info()); }
std::vector<std::string> cuda::CudaBackend::kernel_choices() {
  std::vector<std::string> all = conv_choices(), bn = bn_choices();
  all.insert(all.end(), bn.begin(), bn.end());
  std::sort(all.begin(), all.end());
  return all;
}

}  // namespace spotrain
