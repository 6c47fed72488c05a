// The Reducer's device-communicator path, on any machine: every gradient bucket is marked on
// the training thread (mark_compute) and all-reduced with that mark on the CommWorker thread,
// in order (checked with a recording communicator); the host-staged communicator (ranks that
// share a GPU) moves device buffers through its staging buffer, consuming each mark, with a
// stager whose "device" is a set of host ranges; a CPU session keeps the host communicator; a
// build without CUDA refuses NCCL with one clear line. NCCL itself on a GPU: test_gpu_nccl.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_worker.h"
#include "comm/communicator.h"
#include "comm/staged_comm.h"
#include "engine/grad_sync.h"
#include "core/error.h"
#include "engine/model.h"
#include "engine/session.h"
#include "core/philox.h"
#include "kernels/ops.h"
#include "fmnist_resnet.h"
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

// A ResNet-20 for 1-channel images, initialized from `seed`: several gradient buckets.
std::unique_ptr<Model> small_resnet(Backend& be, uint64_t seed) {
  auto m = std::make_unique<Model>(build_resnet(fmnist_resnet20()), be);
  m->initialize(seed);
  return m;
}

std::vector<float> host_floats(Backend& be, const Tensor& t) {
  Tensor h = be.to_host(t);
  const float* p = h.data<float>();
  return std::vector<float>(p, p + h.numel());
}

TEST(ReducerDevicePath, EveryBucketMarkedOnTheTrainingThreadAndReducedInOrder) {
  auto be = make_backend("cpu", BackendOptions{1, false});
  auto owned = small_resnet(*be, 7);
  Model& m = *owned;
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

// A stager whose "device" memory is the host ranges registered with it; it records the
// marks it made, consumed and dropped, and the bytes moved each way.
class FakeStager final : public DeviceStager {
 public:
  std::string name() const override { return "fake device"; }
  bool on_device(const void* p) override {
    auto a = reinterpret_cast<uintptr_t>(p);
    for (auto& [b, n] : ranges)
      if (a >= b && a < b + n) return true;
    return false;
  }
  DeviceEvent* mark_compute() override { return reinterpret_cast<DeviceEvent*>(++next); }
  void drop(DeviceEvent* m) override { dropped.push_back(reinterpret_cast<uintptr_t>(m)); }
  void to_host(DeviceEvent* after, const void* src, void* dst, size_t bytes) override {
    EXPECT_TRUE(on_device(src));
    EXPECT_FALSE(on_device(dst));
    consumed.push_back(reinterpret_cast<uintptr_t>(after));
    std::memcpy(dst, src, bytes);
    down += bytes;
  }
  void to_device(const void* src, void* dst, size_t bytes) override {
    EXPECT_TRUE(on_device(dst));
    std::memcpy(dst, src, bytes);
    up += bytes;
  }
  void* staging(size_t bytes) override {
    if (buffer.size() < bytes) buffer.resize(bytes);
    return buffer.data();
  }
  std::vector<std::pair<uintptr_t, size_t>> ranges;
  uintptr_t next = 0;
  std::vector<uintptr_t> consumed, dropped;
  size_t down = 0, up = 0;
  std::vector<unsigned char> buffer;
};

TEST(StagedComm, DeviceBuffersGoThroughTheStagingBufferAndHostBuffersStraight) {
  auto host = std::make_unique<RecordingComm>();
  RecordingComm* rec = host.get();
  auto st = std::make_unique<FakeStager>();
  FakeStager* stager = st.get();
  std::vector<float> dev = {1, 2, 3, 4}, plain = {5, 6};
  stager->ranges.push_back({reinterpret_cast<uintptr_t>(dev.data()), dev.size() * sizeof(float)});
  auto comm = make_staged_communicator(std::move(host), std::move(st));
  EXPECT_TRUE(comm->device_buffers());
  EXPECT_NE(comm->name().find("host-staged"), std::string::npos) << comm->name();

  DeviceEvent* mark = comm->mark_compute();
  comm->allreduce_sum_after(mark, dev.data(), 4, DType::f32);
  EXPECT_EQ(dev, (std::vector<float>{2, 4, 6, 8}));
  ASSERT_EQ(stager->consumed.size(), 1u);
  EXPECT_EQ(stager->consumed[0], reinterpret_cast<uintptr_t>(mark));
  EXPECT_EQ(stager->down, 16u);
  EXPECT_EQ(stager->up, 16u);
  ASSERT_EQ(rec->used.size(), 1u);  // the host communicator summed the staging buffer, not dev
  // A host buffer: summed in place by the host communicator; its mark is dropped, not leaked.
  DeviceEvent* m2 = comm->mark_compute();
  comm->allreduce_sum_after(m2, plain.data(), 2, DType::f32);
  EXPECT_EQ(plain, (std::vector<float>{10, 12}));
  EXPECT_EQ(stager->dropped, std::vector<uintptr_t>{reinterpret_cast<uintptr_t>(m2)});
  EXPECT_EQ(stager->down, 16u) << "a host buffer must not be staged";
  // Broadcast: the root (rank 0 here) sends its device values; nothing is copied back to it.
  comm->broadcast(dev.data(), 8, 0);
  EXPECT_EQ(stager->down, 24u);
  EXPECT_EQ(stager->up, 16u);
  // From another root this rank receives: the staging buffer goes to the device.
  comm->broadcast(dev.data(), 8, 1);
  EXPECT_EQ(stager->down, 24u);
  EXPECT_EQ(stager->up, 24u);
}

TEST(StagedComm, TheReducerSumsEveryBucketOnceThroughTheStagingBuffer) {
  auto be = make_backend("cpu", BackendOptions{1, false});
  auto owned = small_resnet(*be, 3);
  Model& m = *owned;
  Tensor g = m.grads_and_tail();
  Philox rng(5, 0);
  Tensor h = Tensor::host({g.numel()});
  for (int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] = rng.normal();
  be->copy(be->from_host(h), g);
  std::vector<float> before = host_floats(*be, g);

  auto host = std::make_unique<RecordingComm>();
  auto st = std::make_unique<FakeStager>();
  FakeStager* stager = st.get();
  stager->ranges.push_back({reinterpret_cast<uintptr_t>(g.data<float>()), size_t(g.nbytes())});
  auto comm = make_staged_communicator(std::move(host), std::move(st));
  {
    CommWorker worker(*comm, 60);
    GradSync red(m, worker, ReducerOptions{0.05, 0.01, "none"});
    ASSERT_GT(red.num_buckets(), 2u);
    for (auto* p : m.params()) red.grad_ready(*p);
    red.finish();
    EXPECT_EQ(stager->consumed.size(), red.num_buckets());
    for (size_t i = 0; i < stager->consumed.size(); ++i)
      EXPECT_EQ(stager->consumed[i], i + 1) << "bucket " << i << " must wait for its own mark";
  }
  EXPECT_EQ(stager->down, size_t(g.nbytes()));
  EXPECT_EQ(stager->up, size_t(g.nbytes()));
  std::vector<float> after = host_floats(*be, m.flat_grads());
  for (size_t i = 0; i < after.size(); ++i)
    ASSERT_EQ(after[i], 2 * before[i]) << "element " << i << " was not summed exactly once";
}

TEST(StagedComm, RanksThatShareAGpuAreFound) {
  const uint64_t a0 = device_key("node-a", "0000:19:00.0");
  const uint64_t a1 = device_key("node-a", "0000:3b:00.0");
  const uint64_t b0 = device_key("node-b", "0000:19:00.0");
  EXPECT_NE(a0, a1);
  EXPECT_NE(a0, b0) << "the same bus id on two hosts is two GPUs";
  EXPECT_NE(device_key("ab", "c"), device_key("a", "bc"));
  EXPECT_FALSE(ranks_share_a_device({a0, a1, b0}));
  EXPECT_TRUE(ranks_share_a_device({a0, a1, a0}));
  EXPECT_FALSE(ranks_share_a_device({a0}));
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
