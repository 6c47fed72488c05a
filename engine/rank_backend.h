// This rank's compute backend and the communicator its collectives go through: one GPU per
// local rank, and NCCL between GPU ranks (host values still over MPI). Shared by the
// Trainer and `spotrain bench`, so both set up a rank the same way.
#pragma once
#include <memory>
#include <string>

#include "comm/comm_worker.h"
#include "comm/communicator.h"
#include "kernels/ops.h"

namespace spotrain {

// Makes the backend for `device`; when it is a GPU and there are several ranks, replaces
// `comm` (the host communicator) by the device one and `worker` by a CommWorker over it.
std::unique_ptr<Backend> make_rank_backend(const std::string& device, const BackendOptions& opt,
                                           std::unique_ptr<Communicator>& comm,
                                           std::unique_ptr<CommWorker>& worker,
                                           double comm_timeout);

}  // namespace spotrain
