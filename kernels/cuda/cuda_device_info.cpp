// The GPU and CUDA libraries this process has (kernels/device_info.h), queried through the
// CUDA runtime, NVML, cuDNN, cuBLAS and NCCL. CUDA builds only; device_info.cpp has the
// answers of a build without CUDA.
#include <cublas_api.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>

#include "core/dynlib.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/cuda/cublas_lazy.h"
#include "kernels/cuda/cudnn_api.h"
#include "kernels/device_info.h"

namespace spotrain {

namespace {

std::string cuda_version(int v) { return str(v / 1000, ".", (v % 1000) / 10); }

// The driver's release string ("580.159.03") through NVML, or "" when NVML is absent. NVML
// stays initialized: telemetry uses it too (nvmlInit counts its callers).
std::string nvml_driver_version() {
  DynLib& lib = nvml_library();
  if (!lib.available()) return "";
  try {
    auto init = reinterpret_cast<int (*)()>(lib.require("nvmlInit_v2"));
    auto version = reinterpret_cast<int (*)(char*, unsigned)>(lib.require("nvmlSystemGetDriverVersion"));
    char buf[96] = {0};
    if (init() == 0 && version(buf, sizeof buf) == 0) return buf;
  } catch (const Error&) {  // an NVML without these calls: no release to report
  }
  return "";
}

GpuInfo query() {
  GpuInfo g;
  g.cuda_build = true;
  g.built_with = str("CUDA ", CUDART_VERSION / 1000, ".", (CUDART_VERSION % 1000) / 10, ", cuDNN ",
                     CUDNN_MAJOR, ".", CUDNN_MINOR, ".", CUDNN_PATCHLEVEL, ", NCCL ", NCCL_MAJOR,
                     ".", NCCL_MINOR, ".", NCCL_PATCH);
  int v = 0;
  if (cudaRuntimeGetVersion(&v) == cudaSuccess) g.cuda_runtime = cuda_version(v);
  // cuDNN, cuBLAS and NCCL are opened only where there is a GPU (core/dynlib.h): until
  // then each reports the version it was built against.
  g.cudnn = str(CUDNN_MAJOR, ".", CUDNN_MINOR, ".", CUDNN_PATCHLEVEL, " (built with)");
  g.cublas = str(CUBLAS_VER_MAJOR, ".", CUBLAS_VER_MINOR, ".", CUBLAS_VER_PATCH, " (built with)");
  g.nccl = str(NCCL_MAJOR, ".", NCCL_MINOR, ".", NCCL_PATCH, " (built with)");
  if (cudaDriverGetVersion(&v) == cudaSuccess && v > 0) g.driver_cuda = cuda_version(v);
  std::string release = nvml_driver_version();
  if (!release.empty()) g.driver = release;
  cudaError_t e = cudaGetDeviceCount(&g.device_count);
  if (e != cudaSuccess || g.device_count == 0) {
    g.device_count = 0;
    g.status = str("no CUDA device: ", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
    cudaGetLastError();  // clear the error so later CUDA calls start clean
    return g;
  }
  int dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    g.status = "no CUDA device: cudaGetDeviceProperties failed";
    return g;
  }
  g.status = "ok";
  // A GPU run loads these anyway: report what this process has.
  std::string blas = cuda::blas::version();
  if (!blas.empty()) g.cublas = blas;
  if (cuda::cudnn_library().available()) {
    size_t dnn = cuda::cudnnGetVersion();
    g.cudnn = str(dnn / 10000, ".", (dnn % 10000) / 100, ".", dnn % 100);
  } else {
    g.cudnn = "not found (" + cuda::cudnn_library().load_error() + ")";
  }
  if (DynLib& nccl = nccl_library(); nccl.available()) {
    auto get = reinterpret_cast<ncclResult_t (*)(int*)>(nccl.require("ncclGetVersion"));
    if (get(&v) == ncclSuccess) g.nccl = str(v / 10000, ".", (v / 100) % 100, ".", v % 100);
  }
  g.name = prop.name;
  g.compute_capability = str(prop.major, ".", prop.minor);
  g.memory_bytes = int64_t(prop.totalGlobalMem);
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, int(sizeof bus), dev) == cudaSuccess) g.pci_bus_id = bus;
  return g;
}
}  // namespace

const GpuInfo& gpu_info() {
  static const GpuInfo info = query();
  return info;
}

int select_cuda_device(int local_rank) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return -1;
  }
  int dev = local_rank % n;
  SPOTRAIN_LIB_CHECK("CUDA", cudaSetDevice(dev), [](cudaError_t s) { return s == cudaSuccess; },
                     cudaGetErrorString);
  return dev;
}

std::string current_gpu_pci_bus_id() {
  int dev = 0;
  char bus[32] = {};
  if (gpu_info().status == "ok" && cudaGetDevice(&dev) == cudaSuccess &&
      cudaDeviceGetPCIBusId(bus, int(sizeof bus), dev) == cudaSuccess)
    return bus;
  return "";
}

std::string current_gpu_uuid() {
  int dev = 0;
  cudaDeviceProp prop;
  if (gpu_info().status != "ok" || cudaGetDevice(&dev) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  const unsigned char* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  char text[48];
  std::snprintf(text, sizeof text,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return text;
}

}  // namespace spotrain
