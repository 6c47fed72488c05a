// cuBLAS loaded on first use (dlopen) instead of at program start: loading libcublas and
// libcublasLt costs ~210 MB of resident memory, which CPU runs of a CUDA build should not
// pay. The few cuBLAS calls the backend makes, with cublas_v2.h's signatures.
#pragma once
#include <cublas_v2.h>

#include <string>

namespace spotrain::cuda::blas {

// Loads the library (once); throws Error naming the library and dlerror() when it cannot.
void load();
// Whether the library is loaded already.
bool loaded();

cublasStatus_t create(cublasHandle_t* handle);
cublasStatus_t destroy(cublasHandle_t handle);
cublasStatus_t set_stream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t set_math_mode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t set_workspace(cublasHandle_t handle, void* workspace, size_t bytes);
cublasStatus_t get_version(cublasHandle_t handle, int* version);
cublasStatus_t sgemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m,
                     int n, int k, const float* alpha, const float* a, int lda, const float* b,
                     int ldb, const float* beta, float* c, int ldc);
const char* status_string(cublasStatus_t s);
// "MAJOR.MINOR.PATCH" of the library (loading it), or "" when it cannot be loaded.
std::string version();

}  // namespace spotrain::cuda::blas
