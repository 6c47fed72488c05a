// The NCCL communicator on a GPU (label gpu; each test skips with "no CUDA device" without
// one): over one rank it all-reduces and broadcasts device buffers after the work queued on
// the compute stream, routes host buffers to the host communicator and rejects unsupported
// types with one clear line.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/philox.h"

#ifdef SPOTRAIN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace spotrain {
namespace {

class NcclOneRank : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef SPOTRAIN_WITH_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), cudaSuccess);
    comm_ = make_nccl_communicator(make_communicator("local"), reinterpret_cast<DeviceStream*>(compute_));
#else
    GTEST_SKIP() << "no CUDA device (this build has no CUDA backend)";
#endif
  }
  void TearDown() override {
#ifdef SPOTRAIN_WITH_CUDA
    comm_.reset();
    if (compute_) cudaStreamDestroy(compute_);
#endif
  }
#ifdef SPOTRAIN_WITH_CUDA
  cudaStream_t compute_ = nullptr;
#endif
  std::unique_ptr<Communicator> comm_;
};

TEST_F(NcclOneRank, AllReducesAndBroadcastsDeviceBuffersAfterTheComputeStream) {
#ifdef SPOTRAIN_WITH_CUDA
  EXPECT_TRUE(comm_->device_buffers());
  EXPECT_EQ(comm_->name().rfind("nccl ", 0), 0u) << comm_->name();
  const int64_t n = 1 << 20;
  std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n), std::nanf(""));
  Philox rng(3, 4);
  for (auto& v : want) v = rng.normal();
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, size_t(n) * 4), cudaSuccess);
  // Written on the compute stream; the all-reduce must start after it (one rank: identity).
  ASSERT_EQ(cudaMemcpyAsync(d, want.data(), size_t(n) * 4, cudaMemcpyHostToDevice, compute_),
            cudaSuccess);
  DeviceEvent* mark = comm_->mark_compute();
  ASSERT_NE(mark, nullptr);
  comm_->allreduce_sum_after(mark, d, n, DType::f32);
  comm_->allreduce_sum(d, n, DType::f32);
  comm_->broadcast(d, size_t(n) * 4, 0);
  ASSERT_EQ(cudaMemcpy(got.data(), d, size_t(n) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, want);
  for (DType dt : {DType::bf16, DType::f16, DType::i32}) comm_->allreduce_sum(d, 1000, dt);
  try {
    comm_->allreduce_sum(d, 16, DType::u8);
    ADD_FAILURE() << "u8 all-reduce should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported dtype"), std::string::npos) << e.what();
  }
  cudaFree(d);
#endif
}

TEST_F(NcclOneRank, HostBuffersGoOverTheHostCommunicator) {
  float host[3] = {1.5f, -2.f, 3.25f};
  comm_->allreduce_sum(host, 3, DType::f32);  // Local: the identity, no NCCL involved
  comm_->broadcast(host, sizeof host, 0);
  EXPECT_EQ(host[0], 1.5f);
  EXPECT_EQ(host[2], 3.25f);
  EXPECT_EQ(comm_->allgather(42), std::vector<uint64_t>{42});
}

}  // namespace
}  // namespace spotrain
