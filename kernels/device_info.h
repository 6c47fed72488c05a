// Which GPU this process runs on and which CUDA libraries it loaded, for `spotrain bench`
// (text and --json), `spotrain --version` and the training start-up log: GPU name, driver,
// CUDA runtime, cuDNN, cuBLAS and NCCL versions, each "none" without a GPU or CUDA build.
// Also the GPU hook the engine needs without including CUDA headers (device per rank).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace spotrain {

struct GpuInfo {
  bool cuda_build = false;          // this binary has the CUDA backend compiled in
  int device_count = 0;             // visible CUDA devices
  std::string status = "none";      // "ok", or why there is no GPU ("no CUDA device: ...")
  std::string name = "none";        // e.g. "NVIDIA H200"
  std::string compute_capability = "none";  // e.g. "9.0"
  int64_t memory_bytes = 0;         // the device's global memory
  std::string pci_bus_id = "none";  // e.g. "0000:19:00.0" (how NVML finds the same device)
  std::string driver = "none";      // NVIDIA driver release from NVML, e.g. "580.159.03"
  std::string driver_cuda = "none"; // newest CUDA the driver supports, e.g. "13.0"
  std::string cuda_runtime = "none";  // the libcudart in use, e.g. "13.0"
  std::string cudnn = "none", cublas = "none", nccl = "none";  // loaded libraries' versions
  std::string built_with = "no CUDA";  // versions of the headers this binary was compiled with
};

// Queried once (device 0, or the current device once one is selected) and cached; never
// throws: anything that fails reads "none".
const GpuInfo& gpu_info();
// name/value pairs in a fixed order (for JSON and logs).
std::vector<std::pair<std::string, std::string>> gpu_info_fields(const GpuInfo& g);
// One line: "GPU NVIDIA H200 (sm 9.0, 139.8 GiB), driver 580.159.03 (CUDA 13.0), CUDA
// runtime 13.0, cuDNN 9.19.0, cuBLAS 13.1.0, NCCL 2.28.9" or "GPU: none (no CUDA device...)".
std::string gpu_info_line(const GpuInfo& g);

// The PCI bus id of this thread's current CUDA device ("0000:19:00.0"), which NVML uses to
// find the same GPU; "" without a GPU or a CUDA build.
std::string current_gpu_pci_bus_id();
// The UUID of this thread's current CUDA device as nvidia-smi prints it
// ("GPU-6f1c2d3e-..."): the GPU itself, wherever it is plugged; "" without a GPU or a CUDA
// build.
std::string current_gpu_uuid();

// Makes device (local_rank mod device count) current for this thread (one GPU per rank);
// returns its index, or -1 when there is no GPU or no CUDA build.
int select_cuda_device(int local_rank);

}  // namespace spotrain
