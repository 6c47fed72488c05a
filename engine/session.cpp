// Session (see session.h).
#include "engine/session.h"

#include "core/log.h"
#include "kernels/device_info.h"
#include "kernels/op_profiler.h"

namespace spotrain {

Session::Session(const SessionOptions& opt) {
  comm_ = make_communicator(opt.comm);
  worker_ = std::make_unique<CommWorker>(*comm_, opt.comm_timeout);
  set_log_enabled(comm_->rank() == 0);
  if (opt.device != "cpu") select_cuda_device(comm_->local_rank());  // one GPU per rank
  backend_ = make_backend(opt.device, opt.backend);
  if (comm_->size() > 1 && backend_->stream()) {  // a GPU: its ranks all-reduce with NCCL
    // NCCL's start-up (its id broadcast over MPI, then every rank connecting) runs as a task
    // of the host communicator's worker, under --comm-timeout: a rank that died before it
    // ends the job with one line instead of hanging the others. The worker's thread takes
    // this rank's GPU first; the host communicator moves into the device one, so the worker
    // (which refers to it) is replaced only after.
    const int local = comm_->local_rank();
    std::unique_ptr<Communicator> dev;
    worker_->run("NCCL start-up", [&] {
      select_cuda_device(local);
      dev = make_nccl_communicator(std::move(comm_), backend_->stream());
    });
    worker_.reset();
    comm_ = std::move(dev);
    worker_ = std::make_unique<CommWorker>(*comm_, opt.comm_timeout);
  }
  if (opt.profile) profiler_ = std::make_unique<OpProfiler>(*backend_);
}

Session::~Session() = default;

void Session::broadcast_from(int root, Tensor& t, const std::string& what) {
  if (world() == 1) return;
  worker_->run("broadcast of " + what, [&] { comm_->broadcast(t.write_raw(), t.nbytes(), root); });
}

void Session::broadcast_buffers(Model& model) {
  broadcast_from_rank0(model.flat_buffers(), "the BN statistics");
}

std::unique_ptr<Model> Session::make_model(const ResNetOptions& net, uint64_t seed) {
  auto model = std::make_unique<Model>(build_resnet(net), *backend_);
  model->initialize(seed);
  broadcast_from_rank0(model->flat_params(), "the initial parameters");
  broadcast_buffers(*model);
  return model;
}

Training Session::make_training(const TrainingSpec& spec) {
  Training t;
  t.model = make_model(spec.net, spec.seed);
  if (world() > 1) t.sync = std::make_unique<GradSync>(*t.model, *worker_, spec.reducer);
  t.sgd = std::make_unique<Sgd>(*t.model, spec.sgd);
  LossScalerOptions lso = spec.scaler;
  lso.enabled = spec.precision == Precision::fp16;
  t.scaler = std::make_unique<LossScaler>(lso);
  t.runner = std::make_unique<StepRunner>(*t.model, *t.sgd, *t.scaler, spec.precision,
                                          t.sync.get(), world());
  if (spec.cuda_graph) t.runner->use_captured_steps();
  return t;
}

}  // namespace spotrain
