// The NCCL Communicator for GPU ranks: one GPU per rank (chosen by local rank), the unique
// id broadcast from rank 0 over MPI, collectives on the caller's CUDA stream. Waiting polls
// ncclCommGetAsyncError so a dead peer becomes an error (and ncclCommAbort) rather than a
// hang. Compiled into CUDA builds; exercised on a GPU by the CUDA backend's tests.
#include "comm/communicator.h"
#include "engine/error.h"

#ifdef SPOTRAIN_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <thread>

#define NCCL_CHECK(call)                                                          \
  do {                                                                            \
    ncclResult_t r_ = (call);                                                     \
    if (r_ != ncclSuccess)                                                        \
      SPOTRAIN_THROW("NCCL call failed: ", #call, " at ", __FILE__, ":", __LINE__, \
                     ": ", ncclGetErrorString(r_));                               \
  } while (0)
#define CUDA_CHECK(call)                                                          \
  do {                                                                            \
    cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess)                                                        \
      SPOTRAIN_THROW("CUDA call failed: ", #call, " at ", __FILE__, ":", __LINE__, \
                     ": ", cudaGetErrorString(e_));                               \
  } while (0)

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
  NcclComm(Communicator& mpi, cudaStream_t stream) : mpi_(mpi), stream_(stream) {
    ncclUniqueId id;
    if (mpi.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    mpi.broadcast(&id, sizeof id, 0);
    CUDA_CHECK(cudaSetDevice(mpi.local_rank()));
    NCCL_CHECK(ncclCommInitRank(&comm_, mpi.size(), id, mpi.rank()));
  }
  ~NcclComm() override {
    if (comm_) ncclCommDestroy(comm_);
  }
  int rank() const override { return mpi_.rank(); }
  int size() const override { return mpi_.size(); }
  int local_rank() const override { return mpi_.local_rank(); }
  std::string name() const override {
    int v = 0;
    ncclGetVersion(&v);
    return str("nccl ", v / 10000, ".", (v / 100) % 100, ".", v % 100);
  }
  void allreduce_sum(void* data, int64_t count, DType dt) override {
    NCCL_CHECK(ncclAllReduce(data, data, size_t(count), nccl_type(dt), ncclSum, comm_, stream_));
    wait();
  }
  void broadcast(void* data, size_t bytes, int root) override {
    NCCL_CHECK(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_));
    wait();
  }
  void barrier() override { mpi_.barrier(); }
  std::vector<uint64_t> allgather(uint64_t v) override { return mpi_.allgather(v); }
  [[noreturn]] void abort(int code) override {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    mpi_.abort(code);
  }

 private:
  // Waits for the stream while watching NCCL's asynchronous error state.
  void wait() {
    while (cudaStreamQuery(stream_) == cudaErrorNotReady) {
      ncclResult_t async = ncclSuccess;
      NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        SPOTRAIN_THROW("NCCL reported ", ncclGetErrorString(async), "; a peer rank failed");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  Communicator& mpi_;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& mpi, void* stream) {
  return std::make_unique<NcclComm>(mpi, static_cast<cudaStream_t>(stream));
}

}  // namespace spotrain

#else

namespace spotrain {
std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, void*) {
  SPOTRAIN_THROW("this build has no NCCL (configure with -DSPOTRAIN_CUDA=ON where nvcc and NCCL "
                 "are installed)");
}
}  // namespace spotrain

#endif
