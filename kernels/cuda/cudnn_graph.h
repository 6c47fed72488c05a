// cuDNN's graph (backend) API: descriptors owned by RAII, and the fused graphs of conv +
// batch-norm fusion (--fusion bn), each planned once per shape; where cuDNN has no engine for a
// graph (shape, dtype or GPU), the plan says so and why, and the caller runs separate ops.
//   forward:  a convolution whose epilogue also writes the per-channel sum and sum of squares
//             of its output (the next batch norm's statistics), optionally with a prologue
//             applying the previous batch norm's scale, bias and ReLU as the input is read;
//   backward: the weight gradient with that prologue, and the data gradient fused with the
//             ReLU's backward (its mask made again from the batch norm's input) and the batch
//             norm's weight gradients, which also yields the per-channel coefficients of the
//             batch norm's input gradient (dx = a * g + b * x + c, one elementwise kernel).
// Internal to kernels/cuda/.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/cudnn_api.h"
#include "kernels/kernel_cache.h"

namespace spotrain::cuda {

// One backend descriptor of cuDNN's graph API, destroyed with its owner (move-only).
class BackendDesc {
 public:
  BackendDesc() = default;
  explicit BackendDesc(cudnnBackendDescriptorType_t type);
  BackendDesc(BackendDesc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  BackendDesc& operator=(BackendDesc&& o) noexcept;
  BackendDesc(const BackendDesc&) = delete;
  BackendDesc& operator=(const BackendDesc&) = delete;
  ~BackendDesc();
  cudnnBackendDescriptor_t get() const { return d_; }
  // Sets an attribute of `n` values (throws Error on a refusal: a malformed graph is a bug).
  BackendDesc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                   int64_t n, const void* values);
  BackendDesc& set(cudnnBackendAttributeName_t name, const BackendDesc& d);
  BackendDesc& set(cudnnBackendAttributeName_t name, int64_t v);
  // cuDNN's verdict; NOT_SUPPORTED and friends are answers, not errors.
  cudnnStatus_t finalize();

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// An NHWC convolution: input n x c x h x w, k filters of r x s, square stride and padding.
struct ConvShape {
  DType dtype = DType::f16;
  int64_t n = 0, c = 0, h = 0, w = 0, k = 0, r = 0, s = 0, stride = 1, pad = 0;
  int64_t p() const { return (h + 2 * pad - r) / stride + 1; }  // output height
  int64_t q() const { return (w + 2 * pad - s) / stride + 1; }  // output width
};

// The three directions of a convolution, as graph operations (FusedGraph::conv_op).
enum class ConvDir { forward, data, filter };

// A run's workspace of at least `bytes`, asked for once the plan to run is known: a caller's
// shared workspace then grows to the chosen plan's need, not to the largest candidate's.
using WorkspaceFn = std::function<void*(size_t bytes)>;

// The planning time of a run's fused graphs (a backend's), and its bound. Planning an engine
// cuDNN compiles at run time took 0.84-1.11 s on an H200 (12-04), and ResNet-50 plans 41
// graphs at its first step (7 per bottleneck shape: conv1's statistics; conv2's and conv3's
// prologue graph, weight gradient and data gradient; stages 2-4 have two conv1 and two conv2
// shapes, stage 1 two conv1 shapes and one conv2): at up to 8 engines tried and 4 kept per
// graph, minutes. Now the rivals of a graph's first engine (at most kTimedPlans - 1 kept,
// kMaxEngineTries - 1 tried) are planned, to be timed, only while the planning of rivals has
// taken under `limit`; past it each graph plans only its first engine that plans, untimed and
// not remembered. So a run's planning takes each graph's first engine (what --no-autotune
// pays too), plus at most `limit` and one graph's rivals; a restart plans the engines the
// kernel cache remembers alone (no rivals, nothing of the budget) and times the next graphs.
struct PlanBudget {
  static constexpr double kLimitSeconds = 20;
  double limit = kLimitSeconds;
  double rival_seconds = 0;  // planning rivals, bounded by `limit`
  double seconds = 0;        // every graph's planning, rivals included
  int graphs = 0;            // graphs planned (fusion_graph counts them)
  int engines = 0;           // execution plans tried (each a compilation, where cuDNN compiles)
  bool said_spent = false;   // the line saying the budget ran out was logged
};

// How a graph's engine is chosen: timed among the plans that finalize (at most kTimedPlans),
// at the graph's first run on the real operands, the fastest kept and remembered in `cache`
// under `key`; or (autotune false, or `budget` spent) the heuristics' first that plans.
struct GraphTuning {
  bool autotune = false;
  KernelCache* cache = nullptr;
  std::string key;  // the graph and its shape
  PlanBudget* budget = nullptr;  // the run's (none: no bound)
};

// What every fused graph shares: the engines cuDNN's heuristics propose (mode A, then the
// fallback list; each engine once, those that keep the asked precision first, at most
// kMaxEngineTries tried per attempt) whose execution plans finalize, the fastest of them at the
// first run where timed (GraphTuning), else the first; or why none planned.
class FusedGraph {
 public:
  // Plans kept for timing at the first run, the heuristics' first and at most two rivals: each
  // costs a compilation where cuDNN compiles the engine at run time (about a second), and a
  // few runs of the kernel.
  static constexpr int kTimedPlans = 3;
  // Engines tried per attempt (intermediates fp32, then 16-bit; for a bf16 prologue, its scale
  // and bias fp32, then bf16): a refused one may also have cost its compilation.
  static constexpr int kMaxEngineTries = kTimedPlans + 2;

  virtual ~FusedGraph() = default;
  bool accepted() const { return accepted_; }
  // Why cuDNN refused the graph ("" when accepted).
  const std::string& refusal() const { return refusal_; }
  // The largest workspace of the plans kept: before the timing, of the candidates (timed in a
  // buffer of their own, freed after the timing); after it, of the plan that runs. A caller
  // passing a buffer (not a WorkspaceFn) to run() gives at least this much.
  size_t workspace_bytes() const;
  // The dtype of the graph's virtual intermediates cuDNN took ("fp32", or the 16-bit type).
  const std::string& intermediates() const { return intermediates_; }
  // The dtype of the BN-ReLU prologue's per-channel scale and bias (graphs with one):
  // fp32 for bf16 where cuDNN takes it, else the activations' (plan_prologue).
  DType scale_bias_dtype() const { return scale_bias_; }
  // cuDNN's global index of the engine kept (-1: unknown), and whether it is one that lowers
  // precision (down-converted inputs, reduced-precision reductions): taken only when no
  // other engine would plan.
  int64_t engine() const { return plans_.empty() ? -1 : plans_.front().engine; }
  bool lowered_precision() const { return !plans_.empty() && plans_.front().lowered; }
  // How the engine was chosen ("timed 3 engines: ...", "kernel cache: ...", "heuristics'
  // first"), for --profile.
  const std::string& how() const { return how_; }
  // Seconds spent planning (engines compiled at run time are compiled then).
  double plan_seconds() const { return plan_seconds_; }
  // The graph was accepted but its first execution failed (`why`): refused from now on, so
  // the caller runs the separate ops.
  void failed_to_run(const std::string& why);

 protected:
  FusedGraph(cudnnHandle_t handle, GraphTuning tuning) : handle_(handle), tuning_(std::move(tuning)) {}
  // Plans with the virtual intermediates in fp32 (cuDNN's older samples), and where that is
  // refused and `retry_16bit`, in the 16-bit type (its newer ones).
  void plan_either(DType dt, bool retry_16bit);
  // plan_either for a graph with the BN-ReLU prologue: for bf16 first with the scale and bias
  // in fp32, then (refused) in bf16; fp16 keeps them in fp16.
  void plan_prologue(DType dt);
  void refuse(std::string why) { refusal_ = std::move(why); }
  // Builds the graph's operations with intermediates of type `inter` into `ops` (and every
  // descriptor they refer to into `keep`, whose elements stay where they are as it grows);
  // false on a refusal (refusal_ says which).
  virtual bool build(cudnnDataType_t inter, std::vector<BackendDesc>& ops,
                     std::deque<BackendDesc>& keep) = 0;
  // Finalizes `d`; a refusal (NOT_SUPPORTED) is kept as refusal_ and gives false, anything
  // else throws.
  bool finalized(BackendDesc& d, const char* what);
  // Appends the BN-ReLU prologue relu(x * scale + bias) on x (of shape sh's input) to `ops`
  // and returns its virtual result (kept in `keep`), the convolution's input; nullptr on a
  // refusal.
  const BackendDesc* bn_relu_prologue(const ConvShape& sh, cudnnDataType_t inter,
                                      const BackendDesc& x, std::vector<BackendDesc>& ops,
                                      std::deque<BackendDesc>& keep);
  // Appends the pointwise operation y = x (mode) b; alpha2 scales b (x - b: ADD with -1).
  bool pointwise_op(cudnnPointwiseMode_t mode, const BackendDesc& x, const BackendDesc* b,
                    const BackendDesc& y, std::vector<BackendDesc>& ops,
                    std::deque<BackendDesc>& keep, const char* what, float alpha2 = 1.f);
  // Appends the convolution of `sh` in direction `dir`, alpha 1 and beta 0, to `ops` (its
  // convolution descriptor kept in `keep`): forward (x, w -> y), data gradient (dy, w -> dx)
  // or weight gradient (x, dy -> dw); false on a refusal.
  bool conv_op(ConvDir dir, const ConvShape& sh, const BackendDesc& in0, const BackendDesc& in1,
               const BackendDesc& out, std::vector<BackendDesc>& ops, std::deque<BackendDesc>& keep);
  // Runs the plan on the handle's stream: tensors by unique id, each 16-byte aligned, the
  // workspace asked of `workspace` for the plan that runs. At the first run with several plans,
  // times each on these operands in a scratch buffer of its own (outputs written repeatedly;
  // `reset`, if given, restores what the runs accumulate into before the real run), keeps the
  // fastest and remembers it.
  void execute(const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
               const WorkspaceFn& workspace, const std::function<void()>& reset = nullptr);

  cudnnHandle_t handle_;

 private:
  // One execution plan and the engine configuration it was made from (kept as long as the
  // plan, as cuDNN's frontend does).
  struct Plan {
    BackendDesc config, plan;
    size_t workspace = 0;
    int64_t engine = -1;
    bool lowered = false;
    int candidate = -1;  // its place in the heuristics' list
  };
  // Plans with intermediates `inter`: the heuristics' candidates in order, or only the one at
  // `only_candidate` if its engine is `only_engine` (a remembered choice; -1: search).
  void plan(cudnnDataType_t inter, int only_candidate, int64_t only_engine);
  void attempt(cudnnDataType_t inter, int only_candidate, int64_t only_engine);
  // Adds `seconds` of planning to the run's budget; says once when it is spent.
  void spend(double seconds);
  bool plan_remembered(DType dt, bool retry_16bit);
  void time_plans(const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
                  const std::function<void()>& reset);
  std::string choice_text(const Plan& p) const;
  GraphTuning tuning_;
  std::vector<Plan> plans_;  // the one to run first; several until timed
  bool accepted_ = false;
  std::string refusal_;
  std::string intermediates_ = "fp32";
  std::string how_;
  double plan_seconds_ = 0;
  DType scale_bias_ = DType::f32;
  bool budget_cut_ = false;  // the last plan() sought no rivals: the run's budget was spent
};

// A graph whose building failed with an error rather than cuDNN's refusal (a descriptor cuDNN
// would not finalize, say): refused, with that error as the reason, so the caller runs the
// separate ops as for any refusal.
class FailedGraph : public FusedGraph {
 public:
  FailedGraph(cudnnHandle_t handle, std::string why) : FusedGraph(handle, GraphTuning{}) {
    refuse("error: " + std::move(why));
  }

 private:
  bool build(cudnnDataType_t, std::vector<BackendDesc>&, std::deque<BackendDesc>&) override {
    return false;
  }
};

// y = conv(x, w) and, per output channel, sum(y) and sum(y^2) in fp32, in one graph. With
// the prologue the convolution reads relu(x * scale + bias) (scale and bias per input channel,
// in scale_bias_dtype()): the previous batch norm and its ReLU applied as x is read, never written.
// Without the statistics (with_stats false) it is the prologue and the convolution alone.
class ConvStatsGraph : public FusedGraph {
 public:
  ConvStatsGraph(cudnnHandle_t handle, const ConvShape& shape, bool bn_relu_prologue = false,
                 bool with_stats = true, GraphTuning tuning = {});
  // x: NHWC, w: KRSC (NHWC filters), y: NHWC, all in shape.dtype; sum, sqsum: k floats each
  // (the statistics only); scale, bias: c values in scale_bias_dtype() (the prologue only).
  // Queued on the handle's stream.
  void run(const void* x, const void* w, void* y, float* sum, float* sqsum,
           const WorkspaceFn& workspace, const void* scale = nullptr, const void* bias = nullptr);
  // The same with a buffer of at least workspace_bytes().
  void run(const void* x, const void* w, void* y, float* sum, float* sqsum, void* workspace,
           const void* scale = nullptr, const void* bias = nullptr) {
    run(x, w, y, sum, sqsum, WorkspaceFn([workspace](size_t) { return workspace; }), scale, bias);
  }

 private:
  bool build(cudnnDataType_t inter, std::vector<BackendDesc>& ops,
             std::deque<BackendDesc>& keep) override;
  ConvShape sh_;
  bool prologue_, stats_;
};

// dw = the weight gradient of conv(relu(x * scale + bias), w) for output gradient dy: the
// convolution's input made again inside the kernel from the batch norm's input x.
class ConvWgradGraph : public FusedGraph {
 public:
  ConvWgradGraph(cudnnHandle_t handle, const ConvShape& shape, GraphTuning tuning = {});
  // x: NHWC (n, c, h, w), dy: NHWC (n, k, p, q), dw: KRSC, all in shape.dtype; scale and
  // bias: c values in scale_bias_dtype().
  void run(const void* x, const void* dy, void* dw, const void* scale, const void* bias,
           const WorkspaceFn& workspace);

 private:
  bool build(cudnnDataType_t inter, std::vector<BackendDesc>& ops,
             std::deque<BackendDesc>& keep) override;
  ConvShape sh_;
};

// The data gradient of conv(relu(bn(x)), w) through the ReLU, and the batch norm's weight
// gradients: g = relu_backward(conv_dgrad(dy, w), bn(x)) with bn(x) = (x - mean) * invstd *
// gamma + beta made again inside the kernel; dgamma, dbeta; and the coefficients of the batch
// norm's input gradient dx = eq_dy * g + eq_x * x + eq_bias per channel.
class DgradDreluDbnGraph : public FusedGraph {
 public:
  DgradDreluDbnGraph(cudnnHandle_t handle, const ConvShape& shape, GraphTuning tuning = {});
  // dy: NHWC (n, k, p, q), w: KRSC, x and g: NHWC (n, c, h, w), all in shape.dtype; the
  // per-channel arguments are c floats each.
  struct Args {
    const void *dy, *w, *x;
    const float *mean, *invstd, *gamma, *beta;
    void* g;
    float *dgamma, *dbeta, *eq_dy, *eq_x, *eq_bias;
  };
  void run(const Args& a, const WorkspaceFn& workspace);

 private:
  bool build(cudnnDataType_t inter, std::vector<BackendDesc>& ops,
             std::deque<BackendDesc>& keep) override;
  ConvShape sh_;
};

}  // namespace spotrain::cuda
