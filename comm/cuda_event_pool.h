// Reusable CUDA events for the device communicators (NCCL and host-staged): a mark of the
// compute stream is taken from the pool and given back once a wait on it is queued. Internal
// to comm/, CUDA builds only.
#pragma once
#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "core/error.h"

namespace spotrain {

class CudaEventPool {
 public:
  CudaEventPool() = default;
  CudaEventPool(const CudaEventPool&) = delete;
  CudaEventPool& operator=(const CudaEventPool&) = delete;
  ~CudaEventPool() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  cudaEvent_t take() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    SPOTRAIN_CHECK(r == cudaSuccess, "CUDA: cudaEventCreateWithFlags failed: ", cudaGetErrorString(r));
    return e;
  }
  void give(cudaEvent_t e) {
    std::lock_guard<std::mutex> lk(mu_);
    free_.push_back(e);
  }

 private:
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

}  // namespace spotrain
