// The NCCL Communicator for GPU ranks: one GPU per rank (the current device), the unique id
// broadcast from rank 0 over the host communicator (MPI), collectives on a dedicated
// high-priority NCCL stream that waits for the compute stream through events, so gradient
// buckets are all-reduced while backward goes on. Host buffers, barrier and allgather go over
// MPI. Waiting polls ncclCommGetAsyncError, so a dead peer becomes an error (and
// ncclCommAbort) rather than a hang. Compiled into CUDA builds.
#include "comm/communicator.h"
#include "core/error.h"

#ifdef SPOTRAIN_WITH_CUDA
#include <cuda_runtime.h>
#include "comm/cuda_event_pool.h"
#include "comm/nccl_api.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace spotrain {
namespace {
inline bool nccl_ok(ncclResult_t r) { return r == ncclSuccess; }
// NCCL's error class plus its last detailed message (which peer, which system call).
inline std::string nccl_msg(ncclResult_t r) {
  std::string detail = ncclGetLastError(nullptr);
  return detail.empty() ? std::string(ncclGetErrorString(r))
                        : str(ncclGetErrorString(r), " (", detail, ")");
}
inline bool cuda_ok(cudaError_t e) { return e == cudaSuccess; }
}  // namespace
}  // namespace spotrain

// One clear line per failure: the call, file:line and NCCL's (or CUDA's) own message.
#define NCCL_CHECK(call) \
  SPOTRAIN_LIB_CHECK("NCCL", call, ::spotrain::nccl_ok, ::spotrain::nccl_msg)
#define COMM_CUDA_CHECK(call) \
  SPOTRAIN_LIB_CHECK("CUDA", call, ::spotrain::cuda_ok, cudaGetErrorString)

namespace spotrain {

namespace {

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    default: SPOTRAIN_THROW("NCCL all-reduce: unsupported dtype ", dtype_name(d));
  }
}

class NcclComm final : public Communicator {
 public:
  NcclComm(std::unique_ptr<Communicator> host, cudaStream_t compute)
      : host_(std::move(host)), compute_(compute) {
    try {
      start();
    } catch (...) {
      // The CommWorker that runs this start-up still refers to the host communicator and
      // aborts the job through it: it must outlive the failure (the process ends anyway).
      host_.release();
      throw;
    }
  }
  void start() {
    COMM_CUDA_CHECK(cudaGetDevice(&device_));
    int least = 0, greatest = 0;  // the highest priority, so communication is not starved
    COMM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    COMM_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    ncclUniqueId id;
    if (host_->rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    host_->broadcast(&id, sizeof id, 0);
    ncclComm_t c = nullptr;
    NCCL_CHECK(ncclCommInitRank(&c, host_->size(), id, host_->rank()));
    comm_ = c;
  }
  ~NcclComm() override {
    cudaSetDevice(device_);
    if (ncclComm_t c = comm_.exchange(nullptr)) ncclCommDestroy(c);
    if (stream_) cudaStreamDestroy(stream_);
  }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  int local_rank() const override { return host_->local_rank(); }
  std::string name() const override {
    int v = 0;
    ncclGetVersion(&v);
    return str("nccl ", v / 10000, ".", (v / 100) % 100, ".", v % 100, " (host values over ",
               host_->name(), ")");
  }
  bool device_buffers() const override { return true; }

  DeviceEvent* mark_compute() override {
    COMM_CUDA_CHECK(cudaSetDevice(device_));
    cudaEvent_t e = events_.take();
    COMM_CUDA_CHECK(cudaEventRecord(e, compute_));
    return reinterpret_cast<DeviceEvent*>(e);
  }
  void allreduce_sum_after(DeviceEvent* mark, void* data, int64_t count, DType dt) override {
    if (!on_device(data)) {
      if (mark) events_.give(reinterpret_cast<cudaEvent_t>(mark));
      host_->allreduce_sum(data, count, dt);
      return;
    }
    cudaEvent_t e = reinterpret_cast<cudaEvent_t>(mark ? mark : mark_compute());
    COMM_CUDA_CHECK(cudaStreamWaitEvent(stream_, e, 0));
    events_.give(e);  // reusable once the wait is queued: a later record does not affect it
    // Not under comm_mu_: an enqueue can block (connecting to a dead peer), and abort() must
    // still get through to unblock it, which is what ncclCommAbort is for.
    NCCL_CHECK(ncclAllReduce(data, data, size_t(count), nccl_type(dt), ncclSum, live(), stream_));
    wait();
  }
  void allreduce_sum(void* data, int64_t count, DType dt) override {
    allreduce_sum_after(nullptr, data, count, dt);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    if (!on_device(data)) return host_->broadcast(data, bytes, root);
    cudaEvent_t e = reinterpret_cast<cudaEvent_t>(mark_compute());
    COMM_CUDA_CHECK(cudaStreamWaitEvent(stream_, e, 0));
    events_.give(e);
    NCCL_CHECK(ncclBroadcast(data, data, bytes, ncclUint8, root, live(), stream_));  // see above
    wait();
  }
  void barrier() override { host_->barrier(); }
  std::vector<uint64_t> allgather(uint64_t v) override { return host_->allgather(v); }
  double runtime_detection_seconds() const override { return host_->runtime_detection_seconds(); }
  [[noreturn]] void abort(int code) override {
    {
      // Not while wait() polls the communicator (it holds the lock only for that call, which
      // returns at once): ncclCommAbort frees it.
      std::lock_guard<std::mutex> lk(comm_mu_);
      ncclComm_t c = comm_.exchange(nullptr);
      if (c) ncclCommAbort(c);  // unblocks a collective stuck on a dead peer
    }
    host_->abort(code);
    std::abort();  // not reached: the host communicator ends the job
  }

 private:
  // Device (or managed) memory goes over NCCL; anything else is a host buffer. Sets this
  // rank's device first: the calling thread (the CommWorker's) must not make a context on
  // GPU 0, as every rank would.
  bool on_device(const void* p) const {
    COMM_CUDA_CHECK(cudaSetDevice(device_));
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }
  // Waits (on the calling thread: the CommWorker's, which enforces --comm-timeout) for the
  // NCCL stream while watching NCCL's asynchronous error state.
  void wait() {
    for (;;) {
      cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) COMM_CUDA_CHECK(q);
      (void)cudaGetLastError();  // "not ready" is no error: leave none behind on this thread
      ncclResult_t async = ncclSuccess;
      {
        std::lock_guard<std::mutex> lk(comm_mu_);
        ncclComm_t c = live();
        NCCL_CHECK(ncclCommGetAsyncError(c, &async));
        if (async != ncclSuccess && comm_.exchange(nullptr)) ncclCommAbort(c);
      }
      if (async != ncclSuccess)
        SPOTRAIN_THROW("NCCL reported ", ncclGetErrorString(async),
                       " during a collective; a peer rank failed (see its log)");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  // The communicator, unless abort() has freed it.
  ncclComm_t live() const {
    ncclComm_t c = comm_;
    SPOTRAIN_CHECK(c, "NCCL communicator was aborted");
    return c;
  }

  std::unique_ptr<Communicator> host_;
  cudaStream_t compute_;         // the backend's; not ours to destroy
  cudaStream_t stream_ = nullptr;  // NCCL's own
  int device_ = 0;
  std::atomic<ncclComm_t> comm_{nullptr};  // abort() may clear it from another thread
  std::mutex comm_mu_;  // held around the error poll of wait() and around the abort
  CudaEventPool events_;  // destroyed after the body of ~NcclComm set the device
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host,
                                                     DeviceStream* compute_stream) {
  return std::make_unique<NcclComm>(std::move(host), reinterpret_cast<cudaStream_t>(compute_stream));
}

}  // namespace spotrain

#else

namespace spotrain {
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator>, DeviceStream*) {
  SPOTRAIN_THROW("this build has no NCCL (configure with -DSPOTRAIN_CUDA=ON where nvcc and NCCL "
                 "are installed)");
}
}  // namespace spotrain

#endif

