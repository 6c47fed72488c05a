// One rank's set-up, the same for `spotrain train`, `eval` and `bench`: the communicator and
// its collective worker, the backend (one GPU per local rank; NCCL between GPU ranks, or host
// memory over MPI where ranks share a GPU; host values always over MPI), and the training
// parts built on them (model, optimizer, loss scaler, gradient sync, step runner), with every
// rank starting from rank 0's weights.
#pragma once
#include <memory>
#include <string>

#include "comm/comm_worker.h"
#include "comm/communicator.h"
#include "comm/reducer.h"
#include "engine/grad_sync.h"
#include "engine/loss_scaler.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "engine/precision.h"
#include "engine/step.h"
#include "kernels/ops.h"
#include "layers/resnet.h"

namespace spotrain {

class OpProfiler;

struct SessionOptions {
  std::string comm = "auto";  // auto (MPI when started by mpirun/srun) | local
  std::string device = "auto";
  BackendOptions backend;
  double comm_timeout = 300;  // seconds a collective may take before the job is aborted
  // GPU ranks: nccl | host (device buffers through host memory over MPI) | auto (nccl unless
  // ranks share a GPU)
  std::string device_comm = "auto";
  bool profile = false;       // time every op (an OpProfiler attached to the backend)
};

// What a training step needs; made by Session::make_training.
struct TrainingSpec {
  ResNetOptions net;  // its fusion_links and fusion_on are made of `fusion`
  // --fusion auto|bn|none, which make_training turns into the model's links, their initial
  // on/off and whether the first step chooses (fusion_mode, engine/fusion_choice.h).
  std::string fusion = "none";
  uint64_t seed = 0;  // weight initialization
  Precision precision = Precision::fp32;
  SgdOptions sgd;
  LossScalerOptions scaler;
  ReducerOptions reducer;
  bool cuda_graph = false;  // StepRunner::use_captured_steps (--cuda-graph, the CLI's default)
  // StepRunner::set_accum_steps: this rank's micro-batches per step (--accum-steps, or its
  // share of the global batch) of step_micro_batches over all ranks (0: world x accum_steps).
  int accum_steps = 1;
  int64_t step_micro_batches = 0;
  // false: the model is left uninitialized for the caller, who loads a checkpoint into it or
  // calls Session::initialize_model (a resumed ResNet-50 skips drawing 23.5 M weights it would
  // overwrite).
  bool initialize = true;
  // The run folder's fast-paths.json (engine/fast_paths.h): the fast paths' first-use
  // verdicts, kept across restarts ("" keeps them in memory).
  std::string fast_path_file;
};
struct Training {
  std::unique_ptr<Model> model;
  std::unique_ptr<Sgd> sgd;
  std::unique_ptr<LossScaler> scaler;
  std::unique_ptr<GradSync> sync;  // null on one rank
  std::unique_ptr<FastPathChecks> checks;  // the runner's first-use verdicts
  std::unique_ptr<StepRunner> runner;
};

class Session {
 public:
  explicit Session(const SessionOptions& opt);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  Communicator& comm() { return *comm_; }
  CommWorker& worker() { return *worker_; }
  Backend& backend() { return *backend_; }
  OpProfiler* profiler() { return profiler_.get(); }  // with opt.profile, else null
  int rank() const { return comm_->rank(); }
  int world() const { return comm_->size(); }

  // A ResNet on this rank's backend, initialized from `seed`; with several ranks every rank
  // then holds rank 0's parameters and buffers.
  std::unique_ptr<Model> make_model(const ResNetOptions& net, uint64_t seed);
  // Draws the model's weights from `seed`; with several ranks every rank then holds rank 0's
  // parameters and buffers.
  void initialize_model(Model& model, uint64_t seed);
  // The model with its optimizer, loss scaler, gradient sync (several ranks) and step runner.
  Training make_training(const TrainingSpec& spec);

  // Every rank gets rank 0's (or root's) contents of `t` / of the model's BN buffers (no-ops
  // on one rank).
  void broadcast_from_rank0(Tensor& t, const std::string& what) { broadcast_from(0, t, what); }
  void broadcast_from(int root, Tensor& t, const std::string& what);
  void broadcast_buffers(Model& model);

 private:
  void start_device_comm(const SessionOptions& opt);

  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<CommWorker> worker_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<OpProfiler> profiler_;  // times backend_'s ops (before it in destruction)
};

}  // namespace spotrain
