// Error checks for the CUDA runtime, cuDNN and cuBLAS: each failed call becomes a
// spotrain::Error naming the call, the library's own error string and file:line (the *_WARN
// variants, for destructors, only print).
// Internal to kernels/cuda/ (host code only).
#pragma once
#include <cublas_v2.h>

#include "kernels/cuda/cublas_lazy.h"
#include <cuda_runtime.h>

#include "kernels/cuda/cudnn_api.h"

#include <cstdio>
#include <string>

#include "core/error.h"

namespace spotrain::cuda {

inline bool cuda_ok(cudaError_t s) { return s == cudaSuccess; }
inline const char* cuda_msg(cudaError_t s) { return cudaGetErrorString(s); }
inline bool cudnn_ok(cudnnStatus_t s) { return s == CUDNN_STATUS_SUCCESS; }
// The status name plus cuDNN 9's own detail of the last failure, when it has one.
inline std::string cudnn_msg(cudnnStatus_t s) {
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  std::string m = cudnnGetErrorString(s);
  if (detail[0]) m += std::string(" (") + detail + ")";
  return m;
}
inline bool cublas_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
inline const char* cublas_msg(cublasStatus_t s) { return blas::status_string(s); }

// The most workspace one kernel choice may take: a quarter of the free memory, at most 2 GiB
// (256 MiB when the question fails).
inline size_t workspace_limit() {
  size_t free_b = 0, total = 0;
  if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) {
    (void)cudaGetLastError();
    return size_t(256) << 20;
  }
  return free_b / 4 < (size_t(2) << 30) ? free_b / 4 : size_t(2) << 30;
}

}  // namespace spotrain::cuda

#define CUDA_CHECK(call) \
  SPOTRAIN_LIB_CHECK("CUDA", call, ::spotrain::cuda::cuda_ok, ::spotrain::cuda::cuda_msg)
#define CUDNN_CHECK(call) \
  SPOTRAIN_LIB_CHECK("cuDNN", call, ::spotrain::cuda::cudnn_ok, ::spotrain::cuda::cudnn_msg)
#define CUBLAS_CHECK(call) \
  SPOTRAIN_LIB_CHECK("cuBLAS", call, ::spotrain::cuda::cublas_ok, ::spotrain::cuda::cublas_msg)
// Checks the launch of the kernel just queued (bad configuration, no device code for this GPU).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// Destructors: report a failure on stderr and go on.
#define SPOTRAIN_LIB_WARN(lib, call, ok, msg)                                                  \
  do {                                                                                         \
    auto spotrain_status_ = (call);                                                            \
    if (!(ok(spotrain_status_)))                                                               \
      std::fprintf(stderr, "warning: %s call failed: %s at %s:%d: %s\n", lib, #call, __FILE__, \
                   __LINE__, std::string(msg(spotrain_status_)).c_str());                      \
  } while (0)
#define CUDA_WARN(call) \
  SPOTRAIN_LIB_WARN("CUDA", call, ::spotrain::cuda::cuda_ok, ::spotrain::cuda::cuda_msg)
#define CUDNN_WARN(call) \
  SPOTRAIN_LIB_WARN("cuDNN", call, ::spotrain::cuda::cudnn_ok, ::spotrain::cuda::cudnn_msg)
#define CUBLAS_WARN(call) \
  SPOTRAIN_LIB_WARN("cuBLAS", call, ::spotrain::cuda::cublas_ok, ::spotrain::cuda::cublas_msg)
