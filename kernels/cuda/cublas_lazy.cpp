// Lazily loaded cuBLAS (see cublas_lazy.h).
#include "kernels/cuda/cublas_lazy.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

#include "core/error.h"

#ifndef SPOTRAIN_CUBLAS_PATH
#define SPOTRAIN_CUBLAS_PATH ""
#endif

namespace spotrain::cuda::blas {

namespace {

struct Api {
  void* lib = nullptr;
  std::string error;
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasDestroy_v2) destroy = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  decltype(&::cublasSetMathMode) set_math_mode = nullptr;
  decltype(&::cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&::cublasGetVersion_v2) get_version = nullptr;
  decltype(&::cublasSgemm_v2) sgemm = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;
  decltype(&::cublasGetProperty) get_property = nullptr;
};

template <class F>
void resolve(Api& a, F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(a.lib, name));
  if (!f && a.error.empty()) a.error = std::string("symbol ") + name + " not found";
}

std::atomic<bool> g_loaded{false};

// The path CMake found first (it may sit outside the loader's search path, e.g. in a
// Python wheel), then the sonames of cuBLAS 13 and 12.
Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {SPOTRAIN_CUBLAS_PATH, "libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
      if (!*name) continue;
      a.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (a.lib) break;
      if (a.error.empty()) a.error = dlerror();
    }
    if (!a.lib) return;
    a.error.clear();
    resolve(a, a.create, "cublasCreate_v2");
    resolve(a, a.destroy, "cublasDestroy_v2");
    resolve(a, a.set_stream, "cublasSetStream_v2");
    resolve(a, a.set_math_mode, "cublasSetMathMode");
    resolve(a, a.set_workspace, "cublasSetWorkspace_v2");
    resolve(a, a.get_version, "cublasGetVersion_v2");
    resolve(a, a.sgemm, "cublasSgemm_v2");
    resolve(a, a.status_string, "cublasGetStatusString");
    resolve(a, a.get_property, "cublasGetProperty");
    if (!a.error.empty()) {
      dlclose(a.lib);
      a.lib = nullptr;
    }
    g_loaded = a.lib != nullptr;
  });
  return a;
}

Api& ready() {
  Api& a = api();
  SPOTRAIN_CHECK(a.lib, "cannot load cuBLAS (", *SPOTRAIN_CUBLAS_PATH ? SPOTRAIN_CUBLAS_PATH : "libcublas.so.13",
                 "): ", a.error);
  return a;
}

}  // namespace

void load() { ready(); }
bool loaded() { return g_loaded.load(); }

cublasStatus_t create(cublasHandle_t* h) { return ready().create(h); }
cublasStatus_t destroy(cublasHandle_t h) { return ready().destroy(h); }
cublasStatus_t set_stream(cublasHandle_t h, cudaStream_t s) { return ready().set_stream(h, s); }
cublasStatus_t set_math_mode(cublasHandle_t h, cublasMath_t m) { return ready().set_math_mode(h, m); }
cublasStatus_t set_workspace(cublasHandle_t h, void* w, size_t bytes) { return ready().set_workspace(h, w, bytes); }
cublasStatus_t get_version(cublasHandle_t h, int* v) { return ready().get_version(h, v); }
cublasStatus_t sgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                     int k, const float* alpha, const float* a, int lda, const float* b, int ldb,
                     const float* beta, float* c, int ldc) {
  return ready().sgemm(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
const char* status_string(cublasStatus_t s) {
  Api& a = api();
  return a.lib ? a.status_string(s) : "cuBLAS error (library not loaded)";
}

std::string version() {
  Api& a = api();
  if (!a.lib) return "";
  int major = 0, minor = 0, patch = 0;
  a.get_property(MAJOR_VERSION, &major);
  a.get_property(MINOR_VERSION, &minor);
  a.get_property(PATCH_LEVEL, &patch);
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

}  // namespace spotrain::cuda::blas
