// make_rank_backend (see rank_backend.h).
#include "engine/rank_backend.h"

#include "kernels/cuda/device_info.h"

namespace spotrain {

std::unique_ptr<Backend> make_rank_backend(const std::string& device, const BackendOptions& opt,
                                           std::unique_ptr<Communicator>& comm,
                                           std::unique_ptr<CommWorker>& worker,
                                           double comm_timeout) {
  if (device != "cpu") select_cuda_device(comm->local_rank());  // one GPU per rank
  auto be = make_backend(device, opt);
  if (comm->size() > 1 && be->device() == Device::cuda) {
    worker.reset();  // the worker runs on the communicator it is about to lose
    comm = communicator_for_device(std::move(comm), be->device(), be->native_stream());
    worker = std::make_unique<CommWorker>(*comm, comm_timeout);
  }
  return be;
}

}  // namespace spotrain
