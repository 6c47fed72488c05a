// Communicator: rank, size, local rank and the collectives data-parallel training needs
// (all-reduce, broadcast, barrier, all-gather of small values). Implementations: Local (one
// process), MPI (host buffers, CPU ranks) and NCCL (device buffers, GPU ranks; the unique
// id travels over MPI). Calls block; the CommWorker runs them off the training thread with a
// timeout, so a dead or hung rank ends the job with a clear error instead of a hang.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/dtype.h"

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
  // Ends every rank of the job with `code` (never returns).
  [[noreturn]] virtual void abort(int code) = 0;
};

// True when this process was started by mpirun/srun (an MPI launcher's variables are set).
bool launched_by_mpi();

// "auto": MPI when launched by an MPI launcher, else Local. "local" / "mpi" force one.
// (NCCL communicators are made by the CUDA backend from an MPI one: make_nccl_communicator.)
std::unique_ptr<Communicator> make_communicator(const std::string& kind = "auto");

// NCCL over the ranks of `mpi` (one GPU per rank, chosen by local rank); throws Error when
// this build has no NCCL.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& mpi, void* cuda_stream);

}  // namespace spotrain
