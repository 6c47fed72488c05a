// Session (see session.h).
#include "engine/session.h"

#include "comm/staged_comm.h"
#include "core/log.h"
#include "engine/fusion_choice.h"
#include "kernels/device_info.h"
#include "kernels/op_profiler.h"
#include "kernels/wrong_op_backend.h"

namespace spotrain {

Session::Session(const SessionOptions& opt) {
  comm_ = make_communicator(opt.comm);
  worker_ = std::make_unique<CommWorker>(*comm_, opt.comm_timeout);
  set_log_enabled(comm_->rank() == 0);
  if (opt.device != "cpu") select_cuda_device(comm_->local_rank());  // one GPU per rank
  // SPOTRAIN_WRONG_OP (a test hook): the backend wrapped so that the named ops compute wrong.
  backend_ = plant_wrong_ops_if_asked(make_backend(opt.device, opt.backend));
  if (comm_->size() > 1 && backend_->stream()) start_device_comm(opt);
  if (opt.profile) profiler_ = std::make_unique<OpProfiler>(*backend_);
}

// GPU ranks all-reduce device buffers with NCCL, or, where ranks share a GPU (which NCCL
// refuses) or --device-comm host says so, through host memory over the MPI communicator.
void Session::start_device_comm(const SessionOptions& opt) {
  SPOTRAIN_CHECK(opt.device_comm == "auto" || opt.device_comm == "nccl" || opt.device_comm == "host",
                 "unknown --device-comm '", opt.device_comm, "'; use auto, nccl or host");
  // Every rank names its host and GPU (through the worker, under --comm-timeout, like every
  // collective before the device communicator exists).
  const uint64_t mine = device_key(host_name(), backend_->gpu_pci_bus_id());
  std::vector<uint64_t> keys;
  worker_->run("check of which GPU each rank has", [&] { keys = comm_->allgather(mine); });
  const bool shared = ranks_share_a_device(keys);
  SPOTRAIN_CHECK(!(shared && opt.device_comm == "nccl"),
                 "--device-comm nccl: some ranks share a GPU, which NCCL refuses; give each rank "
                 "its own GPU or use --device-comm host (or auto)");
  const int local = comm_->local_rank();
  std::unique_ptr<Communicator> dev;
  if (shared || opt.device_comm == "host") {
    if (opt.device_comm == "auto")
      log_info(str("ranks share a GPU (NCCL refuses that): gradients go through host memory over ",
                   comm_->name(), " (--device-comm host)"));
    worker_->run("host-staged communicator start-up", [&] {
      select_cuda_device(local);
      dev = make_staged_communicator(std::move(comm_), make_cuda_stager(backend_->stream()));
    });
  } else {
    // NCCL's start-up (its id broadcast over MPI, then every rank connecting) runs as a task
    // of the host communicator's worker, under --comm-timeout: a rank that died before it
    // ends the job with one line instead of hanging the others. The worker's thread takes
    // this rank's GPU first.
    worker_->run("NCCL start-up", [&] {
      select_cuda_device(local);
      dev = make_nccl_communicator(std::move(comm_), backend_->stream());
    });
  }
  // The host communicator moved into the device one, so the worker (which refers to it) is
  // replaced only after.
  worker_.reset();
  comm_ = std::move(dev);
  worker_ = std::make_unique<CommWorker>(*comm_, opt.comm_timeout);
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
  initialize_model(*model, seed);
  return model;
}

void Session::initialize_model(Model& model, uint64_t seed) {
  model.initialize(seed);
  broadcast_from_rank0(model.flat_params(), "the initial parameters");
  broadcast_buffers(model);
}

Training Session::make_training(const TrainingSpec& spec) {
  Training t;
  const FusionMode fusion = fusion_mode(spec.fusion, *backend_, compute_dtype(spec.precision));
  ResNetOptions net = spec.net;
  net.fusion_links = fusion.links;
  net.fusion_on = fusion.on;
  t.model = std::make_unique<Model>(build_resnet(net), *backend_);
  if (spec.initialize) initialize_model(*t.model, spec.seed);
  if (world() > 1) t.sync = std::make_unique<GradSync>(*t.model, *worker_, spec.reducer);
  t.sgd = std::make_unique<Sgd>(*t.model, spec.sgd);
  LossScalerOptions lso = spec.scaler;
  lso.enabled = spec.precision == Precision::fp16;
  t.scaler = std::make_unique<LossScaler>(lso);
  t.runner = std::make_unique<StepRunner>(*t.model, *t.sgd, *t.scaler, spec.precision,
                                          t.sync.get(), world());
  // Keyed by this rank's device itself (host, GPU UUID and slot), not its model: each rank
  // writes its own device's verdicts.
  const bool gpu = backend_->device() == Device::cuda;
  t.checks = std::make_unique<FastPathChecks>(
      spec.fast_path_file,
      fast_path_device(host_name(), gpu ? current_gpu_uuid() : "", backend_->gpu_pci_bus_id(),
                       gpu ? gpu_info_line(gpu_info()) : backend_->name()));
  t.runner->set_fast_path_checks(t.checks.get());
  if (fusion.choose) t.runner->choose_fusion_at_first_step();
  t.runner->set_accum_steps(spec.accum_steps, spec.step_micro_batches);
  if (spec.cuda_graph) {
    // Where the backend could capture but this run cannot, one line says why (the CPU never
    // captures: nothing to say).
    const std::string why = t.runner->use_captured_steps();
    if (!why.empty() && backend_->capture() != nullptr)
      log_info(str("steps run as they come, not captured: ", why));
  }
  return t;
}

}  // namespace spotrain
