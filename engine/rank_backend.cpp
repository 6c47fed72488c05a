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
    // NCCL's start-up (its id broadcast over MPI, then every rank connecting) runs as a task
    // of the host communicator's worker, under --comm-timeout: a rank that died before it
    // ends the job with one line instead of hanging the others. The worker's thread takes
    // this rank's GPU first; the host communicator moves into the device one, so the worker
    // (which refers to it) is replaced only after.
    const int local = comm->local_rank();
    std::unique_ptr<Communicator> dev;
    worker->run("NCCL start-up", [&] {
      select_cuda_device(local);
      dev = communicator_for_device(std::move(comm), be->device(), be->native_stream());
    });
    worker.reset();
    comm = std::move(dev);
    worker = std::make_unique<CommWorker>(*comm, comm_timeout);
  }
  return be;
}

}  // namespace spotrain
