// GPU and CUDA library versions (see device_info.h): their formatting, and the answers of a
// build without the CUDA backend (a CUDA build's come from kernels/cuda/cuda_device_info.cpp).
#include "kernels/device_info.h"

#include "core/error.h"
#include "core/log.h"

namespace spotrain {

#ifndef SPOTRAIN_WITH_CUDA
const GpuInfo& gpu_info() {
  static const GpuInfo info = [] {
    GpuInfo g;
    g.status = "this build has no CUDA backend";
    return g;
  }();
  return info;
}

int select_cuda_device(int) { return -1; }

std::string current_gpu_pci_bus_id() { return ""; }

std::string current_gpu_uuid() { return ""; }
#endif

std::vector<std::pair<std::string, std::string>> gpu_info_fields(const GpuInfo& g) {
  return {{"gpu", g.name},
          {"gpu_status", g.status},
          {"gpu_count", str(g.device_count)},
          {"compute_capability", g.compute_capability},
          {"gpu_memory_gib", g.memory_bytes ? fmt_fixed(double(g.memory_bytes) / (1 << 30), 1) : "none"},
          {"pci_bus_id", g.pci_bus_id},
          {"driver", g.driver},
          {"driver_cuda", g.driver_cuda},
          {"cuda_runtime", g.cuda_runtime},
          {"cudnn", g.cudnn},
          {"cublas", g.cublas},
          {"nccl", g.nccl},
          {"built_with", g.built_with}};
}

std::string gpu_info_line(const GpuInfo& g) {
  std::string libs = str("CUDA runtime ", g.cuda_runtime, ", cuDNN ", g.cudnn, ", cuBLAS ", g.cublas,
                         ", NCCL ", g.nccl);
  if (g.status != "ok")
    return str("GPU: none (", g.status, ")", g.cuda_build ? "; " + libs : std::string());
  return str("GPU ", g.name, " (sm ", g.compute_capability, ", ",
             fmt_fixed(double(g.memory_bytes) / (1 << 30), 1), " GiB, ", g.device_count,
             g.device_count == 1 ? " device" : " devices", "), driver ", g.driver, " (CUDA ",
             g.driver_cuda, "), ", libs);
}

}  // namespace spotrain
