// GPU and CUDA library versions (see device_info.h). NVML (for the driver's release number)
// is opened with dlopen, so the binary does not need libnvidia-ml to start.
#include "kernels/device_info.h"

#include <dlfcn.h>

#include "core/error.h"
#include "core/log.h"

#ifdef SPOTRAIN_WITH_CUDA
#include <cublas_api.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "core/dynlib.h"
#include "kernels/cuda/cublas_lazy.h"
#include "kernels/cuda/cudnn_api.h"
#endif

namespace spotrain {

namespace {

#ifdef SPOTRAIN_WITH_CUDA
#ifndef SPOTRAIN_NCCL_PATH
#define SPOTRAIN_NCCL_PATH ""
#endif
std::string cuda_version(int v) { return str(v / 1000, ".", (v % 1000) / 10); }

// The driver's release string ("580.159.03") through NVML, or "" when NVML is absent.
std::string nvml_driver_version() {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!lib) return "";
  using InitFn = int (*)();
  using VersionFn = int (*)(char*, unsigned);
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
  auto version = reinterpret_cast<VersionFn>(dlsym(lib, "nvmlSystemGetDriverVersion"));
  auto shutdown = reinterpret_cast<InitFn>(dlsym(lib, "nvmlShutdown"));
  std::string out;
  char buf[96] = {0};
  if (init && version && init() == 0) {
    if (version(buf, sizeof buf) == 0) out = buf;
    if (shutdown) shutdown();
  }
  dlclose(lib);
  return out;
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
  static DynLib nccl("NCCL 2", {SPOTRAIN_NCCL_PATH, "libnccl.so.2"});  // comm/ opens the same
  if (nccl.available()) {
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
#else
GpuInfo query() {
  GpuInfo g;
  g.status = "this build has no CUDA backend";
  return g;
}
#endif

}  // namespace

const GpuInfo& gpu_info() {
  static const GpuInfo info = query();
  return info;
}

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

int select_cuda_device(int local_rank) {
#ifdef SPOTRAIN_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return -1;
  }
  int dev = local_rank % n;
  SPOTRAIN_LIB_CHECK("CUDA", cudaSetDevice(dev), [](cudaError_t s) { return s == cudaSuccess; },
                     cudaGetErrorString);
  return dev;
#else
  (void)local_rank;
  return -1;
#endif
}

std::string current_gpu_pci_bus_id() {
#ifdef SPOTRAIN_WITH_CUDA
  int dev = 0;
  char bus[32] = {};
  if (gpu_info().status == "ok" && cudaGetDevice(&dev) == cudaSuccess &&
      cudaDeviceGetPCIBusId(bus, int(sizeof bus), dev) == cudaSuccess)
    return bus;
#endif
  return "";
}

}  // namespace spotrain
