// make_backend: the one place that picks a backend for --device. A CPU-only build compiles
// without SPOTRAIN_WITH_CUDA and links no CUDA code; --device cuda then says how to get it.
#include <memory>
#include <string>

#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/ops.h"

namespace spotrain {

#ifdef SPOTRAIN_WITH_CUDA
bool cuda_device_available();                                        // kernels/cuda
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opt);
#endif

bool cuda_backend_ready() {
#ifdef SPOTRAIN_WITH_CUDA
  return cuda_device_available();
#else
  return false;
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& device, const BackendOptions& opt) {
  if (device == "cpu") return std::make_unique<cpu::CpuBackend>(opt);
  if (device == "cuda" || device == "auto") {
#ifdef SPOTRAIN_WITH_CUDA
    if (device == "cuda" || cuda_device_available()) return make_cuda_backend(opt);
#else
    SPOTRAIN_CHECK(device == "auto",
                   "--device cuda: this build has no CUDA support (configure with "
                   "-DSPOTRAIN_CUDA=ON on a machine with nvcc); use --device cpu");
#endif
    return std::make_unique<cpu::CpuBackend>(opt);
  }
  SPOTRAIN_THROW("unknown device '", device, "'; use auto, cpu or cuda");
}

}  // namespace spotrain
