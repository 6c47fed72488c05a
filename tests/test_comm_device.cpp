// The Reducer's device-communicator path, on any machine: every gradient bucket is marked on
// the training thread (mark_compute) and all-reduced with that mark on the CommWorker thread,
// in order (checked with a recording communicator); a CPU session keeps the host
// communicator; a build without CUDA refuses NCCL with one clear line. NCCL itself on a GPU:
// test_gpu_nccl.cpp.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_worker.h"
#include "comm/communicator.h"
#include "engine/grad_sync.h"
#include "core/error.h"
#include "engine/model.h"
#include "engine/session.h"
#include "core/philox.h"
#include "kernels/ops.h"
#include "layers/resnet.h"

namespace spotrain {
namespace {

// Two identical "ranks": the sum doubles every element. Records who marked and who reduced.
class RecordingComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  int local_rank() const override { return 0; }
  std::string name() const override { return "recording"; }
  void allreduce_sum(void* data, int64_t count, DType dt) override {
    allreduce_sum_after(nullptr, data, count, dt);
  }
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
  std::vector<uint64_t> allgather(uint64_t v) override { return {v, v}; }
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
  DeviceEvent* mark_compute() override {
    std::lock_guard<std::mutex> lk(mu);
    marks.push_back(++next);
    mark_threads.push_back(std::this_thread::get_id());
    return reinterpret_cast<DeviceEvent*>(next);
  }
  void allreduce_sum_after(DeviceEvent* mark, void* data, int64_t count, DType dt) override {
    EXPECT_EQ(dt, DType::f32);
    float* p = static_cast<float*>(data);
    for (int64_t i = 0; i < count; ++i) p[i] *= 2;
    std::lock_guard<std::mutex> lk(mu);
    used.push_back(reinterpret_cast<uintptr_t>(mark));
    reduce_threads.push_back(std::this_thread::get_id());
  }
  std::mutex mu;
  uintptr_t next = 0;
  std::vector<uintptr_t> marks, used;
  std::vector<std::thread::id> mark_threads, reduce_threads;
};

std::vector<float> host_floats(Backend& be, const Tensor& t) {
  Tensor h = be.to_host(t);
  const float* p = h.data<float>();
  return std::vector<float>(p, p + h.numel());
}

TEST(ReducerDevicePath, EveryBucketMarkedOnTheTrainingThreadAndReducedInOrder) {
  auto be = make_backend("cpu", BackendOptions{1, false});
  ResNetOptions ro;
  ro.arch = "resnet20";
  ro.in_channels = 1;
  ro.num_classes = 10;
  Model m(build_resnet(ro), *be);
  m.initialize(7);
  Tensor x = Tensor::host({4, 1, 12, 12}, DType::f32, Layout::nhwc);
  Philox rng(11, 0);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = rng.normal();
  std::vector<int32_t> labels = {1, 3, 5, 7};

  auto grads = [&](GradListener* l) {
    Tensor logits = m.forward(be->upload_images(x), /*training=*/true);
    Tensor dl;
    be->softmax_xent(logits, labels.data(), 0.f, 1.f, &dl);
    m.backward(dl, l);
  };
  grads(nullptr);
  std::vector<float> local = host_floats(*be, m.flat_grads());

  RecordingComm comm;
  {
    CommWorker worker(comm, 60);
    GradSync red(m, worker, ReducerOptions{0.05, 0.01, "none"});
    ASSERT_GT(red.num_buckets(), 2u) << "the test needs several buckets";
    grads(&red);
    red.finish();
    EXPECT_EQ(comm.marks.size(), red.num_buckets());
  }
  ASSERT_EQ(comm.used, comm.marks) << "each all-reduce must consume its bucket's mark, in order";
  for (auto id : comm.mark_threads) EXPECT_EQ(id, std::this_thread::get_id());
  for (auto id : comm.reduce_threads) EXPECT_NE(id, std::this_thread::get_id());
  std::vector<float> reduced = host_floats(*be, m.flat_grads());
  ASSERT_EQ(reduced.size(), local.size());
  for (size_t i = 0; i < local.size(); ++i)
    ASSERT_EQ(reduced[i], 2 * local[i]) << "element " << i << " was not all-reduced exactly once";
}

TEST(Session, ACpuBackendHasNoDeviceQueueAndKeepsTheHostCommunicator) {
  SessionOptions so;
  so.comm = "local";
  so.device = "cpu";
  Session s(so);
  EXPECT_EQ(s.backend().stream(), nullptr);
  EXPECT_FALSE(s.comm().device_buffers());
  EXPECT_EQ(s.comm().mark_compute(), nullptr);
  EXPECT_EQ(s.comm().name(), "local");
}

#ifndef SPOTRAIN_WITH_CUDA
TEST(NcclComm, ThisBuildHasNoNccl) {
  try {
    make_nccl_communicator(make_communicator("local"), nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no NCCL"), std::string::npos) << e.what();
  }
}
#endif

}  // namespace
}  // namespace spotrain
