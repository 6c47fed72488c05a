// Communicator: rank, size, local rank and the collectives data-parallel training needs
// (all-reduce, broadcast, barrier, all-gather of small values). Implementations: Local (one
// process), MPI (host buffers, CPU ranks), NCCL (device buffers on its own CUDA stream, GPU
// ranks; the unique id and host buffers travel over MPI) and host-staged (device buffers
// through host memory over MPI, for ranks sharing a GPU: staged_comm.h). Calls block; the
// CommWorker runs them off the training thread with a timeout, so a dead or hung rank ends the
// job with a clear error instead of a hang.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device_handles.h"
#include "core/dtype.h"

namespace spotrain {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // rank among the processes on this node
  virtual std::string name() const = 0;
  // In-place sum over all ranks of `count` elements of dtype f32, bf16 or f16 (16-bit
  // types are summed in fp32 and rounded once per step of the reduction).
  virtual void allreduce_sum(void* data, int64_t count, DType dtype) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  virtual std::vector<uint64_t> allgather(uint64_t value) = 0;
  // Point to point: sends `bytes` of `send` to rank `peer` while receiving as many from it
  // into `recv` (both ranks call it, naming each other); host buffers. For measuring links
  // (health/links.h), not for training: MPI offers it, the others throw.
  virtual void exchange(int peer, const void* send, void* recv, size_t bytes);
  // Ends every rank of the job with `code` (never returns).
  [[noreturn]] virtual void abort(int code) = 0;
  // Seconds the launcher's runtime takes to notice a node that stopped answering and end the
  // job by itself (0: it does not, or not soon). After a lost peer a rank leaves it that long
  // before aborting: Open MPI's own end of the job stops every process on every node, while an
  // abort sent towards an unreachable node leaves mpirun and that node's daemon waiting on each
  // other for many minutes.
  virtual double runtime_detection_seconds() const { return 0; }

  // Device communicators (NCCL) all-reduce and broadcast device buffers (host buffers still
  // work: they go over the host communicator). False for Local and MPI.
  virtual bool device_buffers() const { return false; }
  // Device communicators: marks everything queued on the compute stream so far. Called on
  // the training thread when backward hands over a bucket; the GPU, not the host, waits.
  // nullptr on host communicators.
  virtual DeviceEvent* mark_compute() { return nullptr; }
  // allreduce_sum that starts (on the communication stream) only after `mark`, a value from
  // mark_compute() that it consumes; host communicators ignore the mark.
  virtual void allreduce_sum_after(DeviceEvent* mark, void* data, int64_t count, DType dtype) {
    (void)mark;
    allreduce_sum(data, count, dtype);
  }
};

// True when this process was started by mpirun/srun (an MPI launcher's variables are set).
bool launched_by_mpi();

// "auto": MPI when launched by an MPI launcher, else Local. "local" / "mpi" force one.
// (Several GPU ranks then move it into an NCCL or host-staged communicator: engine/session.cpp.)
std::unique_ptr<Communicator> make_communicator(const std::string& kind = "auto");

// NCCL over the ranks of `host` (MPI), which it keeps for host buffers, barrier, allgather
// and abort; the unique id travels over it. One GPU per rank: the device current when this
// is called (select_cuda_device). Collectives run on NCCL's own stream, ordered after
// `compute_stream` (the backend's, Backend::stream()) with events. Throws Error when this
// build has no NCCL.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host,
                                                     DeviceStream* compute_stream);

}  // namespace spotrain
