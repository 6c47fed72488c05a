// The CUDA DeviceStager (see staged_comm.h): copies between the rank's GPU and one page-locked
// host buffer on a stream of its own, which waits for the compute stream through events, so
// a gradient bucket leaves the GPU as soon as backward wrote it while backward goes on.
// Every call sets the rank's device first: it runs on the CommWorker's thread. Compiled into
// CUDA builds.
#include "comm/staged_comm.h"
#include "core/error.h"

#ifdef SPOTRAIN_WITH_CUDA
#include <cuda_runtime.h>

#include "comm/cuda_event_pool.h"

namespace spotrain {

namespace {

inline bool cuda_ok(cudaError_t e) { return e == cudaSuccess; }
#define STAGE_CUDA_CHECK(call) SPOTRAIN_LIB_CHECK("CUDA", call, cuda_ok, cudaGetErrorString)

class CudaStager final : public DeviceStager {
 public:
  explicit CudaStager(cudaStream_t compute) : compute_(compute) {
    STAGE_CUDA_CHECK(cudaGetDevice(&device_));
    STAGE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~CudaStager() override {
    cudaSetDevice(device_);
    if (host_) cudaFreeHost(host_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  std::string name() const override { return str("CUDA device ", device_); }
  bool on_device(const void* p) override {
    STAGE_CUDA_CHECK(cudaSetDevice(device_));
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }
  DeviceEvent* mark_compute() override {
    STAGE_CUDA_CHECK(cudaSetDevice(device_));
    cudaEvent_t e = events_.take();
    STAGE_CUDA_CHECK(cudaEventRecord(e, compute_));
    return reinterpret_cast<DeviceEvent*>(e);
  }
  void drop(DeviceEvent* mark) override { events_.give(reinterpret_cast<cudaEvent_t>(mark)); }
  void to_host(DeviceEvent* after, const void* src, void* dst, size_t bytes) override {
    cudaEvent_t e = reinterpret_cast<cudaEvent_t>(after ? after : mark_compute());
    STAGE_CUDA_CHECK(cudaSetDevice(device_));
    STAGE_CUDA_CHECK(cudaStreamWaitEvent(stream_, e, 0));
    events_.give(e);  // reusable once the wait is queued
    STAGE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    STAGE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void to_device(const void* src, void* dst, size_t bytes) override {
    STAGE_CUDA_CHECK(cudaSetDevice(device_));
    STAGE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    // Returns only when the values are on the device: the step's next work (the optimizer,
    // queued on the compute stream after Reducer::finish) reads them.
    STAGE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void* staging(size_t bytes) override {
    if (bytes <= capacity_) return host_;
    STAGE_CUDA_CHECK(cudaSetDevice(device_));
    if (host_) STAGE_CUDA_CHECK(cudaFreeHost(host_));
    host_ = nullptr;
    capacity_ = 0;
    STAGE_CUDA_CHECK(cudaMallocHost(&host_, bytes));
    capacity_ = bytes;
    return host_;
  }

 private:
  cudaStream_t compute_;  // the backend's; not ours to destroy
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
  void* host_ = nullptr;
  size_t capacity_ = 0;
  CudaEventPool events_;
};

}  // namespace

std::unique_ptr<DeviceStager> make_cuda_stager(DeviceStream* compute_stream) {
  return std::make_unique<CudaStager>(reinterpret_cast<cudaStream_t>(compute_stream));
}

}  // namespace spotrain

#else

namespace spotrain {
std::unique_ptr<DeviceStager> make_cuda_stager(DeviceStream*) {
  SPOTRAIN_THROW("this build has no CUDA (configure with -DSPOTRAIN_CUDA=ON where nvcc is installed)");
}
}  // namespace spotrain

#endif
