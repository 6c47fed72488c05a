// The host-staged communicator (see staged_comm.h). Collectives run on the CommWorker thread,
// one at a time, so one staging buffer serves them all; the mutex only guards against a
// caller that bypasses the worker.
#include "comm/staged_comm.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <set>

#include "core/error.h"

namespace spotrain {

namespace {

class StagedComm final : public Communicator {
 public:
  StagedComm(std::unique_ptr<Communicator> host, std::unique_ptr<DeviceStager> stager)
      : host_(std::move(host)), stager_(std::move(stager)) {}
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  int local_rank() const override { return host_->local_rank(); }
  std::string name() const override {
    return str("host-staged ", stager_->name(), " (device buffers over ", host_->name(), ")");
  }
  bool device_buffers() const override { return true; }
  DeviceEvent* mark_compute() override { return stager_->mark_compute(); }

  void allreduce_sum_after(DeviceEvent* mark, void* data, int64_t count, DType dt) override {
    if (!stager_->on_device(data)) {
      if (mark) stager_->drop(mark);
      host_->allreduce_sum(data, count, dt);
      return;
    }
    const size_t bytes = size_t(count) * dtype_size(dt);
    std::lock_guard<std::mutex> lk(mu_);
    void* h = stager_->staging(bytes);
    stager_->to_host(mark, data, h, bytes);
    host_->allreduce_sum(h, count, dt);
    stager_->to_device(h, data, bytes);
  }
  void allreduce_sum(void* data, int64_t count, DType dt) override {
    allreduce_sum_after(nullptr, data, count, dt);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    if (!stager_->on_device(data)) return host_->broadcast(data, bytes, root);
    std::lock_guard<std::mutex> lk(mu_);
    void* h = stager_->staging(bytes);
    if (rank() == root) stager_->to_host(nullptr, data, h, bytes);
    host_->broadcast(h, bytes, root);
    if (rank() != root) stager_->to_device(h, data, bytes);
  }
  void barrier() override { host_->barrier(); }
  std::vector<uint64_t> allgather(uint64_t v) override { return host_->allgather(v); }
  double runtime_detection_seconds() const override { return host_->runtime_detection_seconds(); }
  [[noreturn]] void abort(int code) override {
    host_->abort(code);
    std::abort();  // not reached: the host communicator ends the job
  }

 private:
  std::unique_ptr<Communicator> host_;
  std::unique_ptr<DeviceStager> stager_;
  std::mutex mu_;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> host,
                                                       std::unique_ptr<DeviceStager> stager) {
  SPOTRAIN_CHECK(host && stager, "internal: a staged communicator needs a host communicator and a stager");
  return std::make_unique<StagedComm>(std::move(host), std::move(stager));
}

bool ranks_share_a_device(const std::vector<uint64_t>& device_keys) {
  std::set<uint64_t> seen(device_keys.begin(), device_keys.end());
  return seen.size() != device_keys.size();
}

uint64_t device_key(const std::string& hostname, const std::string& pci_bus_id) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over "host\0bus"
  auto mix = [&h](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0u) * 1099511628211ull;
  };
  mix(hostname);
  mix(pci_bus_id);
  return h;
}

}  // namespace spotrain
