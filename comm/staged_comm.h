// A device communicator that goes through host memory: device buffers are copied to a host
// staging buffer, summed or broadcast over the host communicator (MPI), and copied back. For
// GPU ranks that share one GPU, which NCCL refuses (--device-comm host): slower than NCCL, but
// the same collectives, marks and rank agreement, so several ranks can run on the one GPU a
// machine has.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace spotrain {

// The device side of a host-staged communicator: which buffers live on the device, marks of
// the compute queue, and copies between device and host memory that return when done.
class DeviceStager {
 public:
  virtual ~DeviceStager() = default;
  virtual std::string name() const = 0;
  virtual bool on_device(const void* p) = 0;
  // Marks everything queued on the compute stream so far (see Communicator::mark_compute).
  virtual DeviceEvent* mark_compute() = 0;
  // Forgets a mark that will not be waited on.
  virtual void drop(DeviceEvent* mark) = 0;
  // Copies device `src` to host `dst` once `after` (a mark, consumed) is reached on the device;
  // nullptr: after everything queued on the compute stream so far.
  virtual void to_host(DeviceEvent* after, const void* src, void* dst, size_t bytes) = 0;
  virtual void to_device(const void* src, void* dst, size_t bytes) = 0;
  // A host buffer of at least `bytes` (page-locked where the device has such), reused.
  virtual void* staging(size_t bytes) = 0;
};

// The CUDA stager: copies on its own stream of the current device, ordered after
// `compute_stream` with events. Throws Error in a build without CUDA.
std::unique_ptr<DeviceStager> make_cuda_stager(DeviceStream* compute_stream);

// The host-staged communicator over `host` (which keeps host buffers, barrier, allgather and
// abort) and `stager`.
std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> host,
                                                       std::unique_ptr<DeviceStager> stager);

// True when two of `device_keys` (one per rank: its host and GPU, see device_key) are the
// same: ranks that share a GPU, which NCCL refuses.
bool ranks_share_a_device(const std::vector<uint64_t>& device_keys);
// A key naming this host's GPU `pci_bus_id` among all the job's hosts.
uint64_t device_key(const std::string& hostname, const std::string& pci_bus_id);

}  // namespace spotrain
