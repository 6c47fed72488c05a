// BackendDesc, FusedGraph and the fused graphs of conv + batch-norm fusion (see
// cudnn_graph.h). Each graph's operations are built by its build(); FusedGraph makes the
// operation graph, asks cuDNN's heuristics for engines (mode A, then the fallback list) and
// keeps the first whose execution plan finalizes.
#include "kernels/cuda/cudnn_graph.h"

#include "kernels/cuda/cuda_util.h"

#include <algorithm>
#include <limits>

#include "core/clock.h"
#include "core/log.h"

namespace spotrain::cuda {

BackendDesc::BackendDesc(cudnnBackendDescriptorType_t type) {
  CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_));
}

BackendDesc& BackendDesc::operator=(BackendDesc&& o) noexcept {
  if (this != &o) {
    if (d_) cudnnBackendDestroyDescriptor(d_);
    d_ = o.d_;
    o.d_ = nullptr;
  }
  return *this;
}

BackendDesc::~BackendDesc() {
  if (d_) CUDNN_WARN(cudnnBackendDestroyDescriptor(d_));
}

BackendDesc& BackendDesc::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                              int64_t n, const void* values) {
  CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, n, values));
  return *this;
}

BackendDesc& BackendDesc::set(cudnnBackendAttributeName_t name, const BackendDesc& d) {
  cudnnBackendDescriptor_t raw = d.get();
  return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
}

BackendDesc& BackendDesc::set(cudnnBackendAttributeName_t name, int64_t v) {
  return set(name, CUDNN_TYPE_INT64, 1, &v);
}

cudnnStatus_t BackendDesc::finalize() { return cudnnBackendFinalize(d_); }

namespace {

// The tensors' unique ids (one namespace for every graph).
enum Uid : int64_t {
  kX = 1, kW, kY, kSum, kSqSum, kScale, kBias, kScaled, kBiased, kActivated,  // forward
  kDy, kDw,                                                                  // weight gradient
  kMean, kInvStd, kGamma, kBeta, kG, kDgamma, kDbeta, kEqDy, kEqX, kEqBias,  // data gradient
  kDgradOut, kCentered, kNormed, kGammaed, kBnOut,
};

cudnnDataType_t graph_dtype(DType d) {
  switch (d) {
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    case DType::f32: return CUDNN_DATA_FLOAT;
    default: SPOTRAIN_THROW("cuDNN graph: unsupported dtype ", dtype_name(d));
  }
}

// A tensor of logical dims (N, C, H, W) stored NHWC, 16-byte aligned; a virtual one lives only
// inside the fused kernel.
BackendDesc nhwc_tensor(int64_t uid, cudnnDataType_t dt, int64_t n, int64_t c, int64_t h, int64_t w,
                        bool is_virtual = false) {
  const int64_t dims[4] = {n, c, h, w};
  const int64_t strides[4] = {h * w * c, 1, w * c, c};
  BackendDesc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims)
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides)
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, int64_t(16))
      .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  CUDNN_CHECK(t.finalize());
  return t;
}

std::string status_text(cudnnStatus_t st) { return cudnn_msg(st); }

// A pointwise operator computed in fp32. A ReLU's clips are set, not left to defaults: max(x,
// 0) with no upper clip (the largest float) and no slope below, as cuDNN's frontend sets them.
BackendDesc pointwise(cudnnPointwiseMode_t mode) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  BackendDesc d(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  d.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
      .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  if (mode == CUDNN_POINTWISE_RELU_FWD || mode == CUDNN_POINTWISE_RELU_BWD) {
    const double lower = 0, upper = std::numeric_limits<float>::max(), slope = 0;
    d.set(CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP, CUDNN_TYPE_DOUBLE, 1, &lower)
        .set(CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP, CUDNN_TYPE_DOUBLE, 1, &upper)
        .set(CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE, CUDNN_TYPE_DOUBLE, 1, &slope);
  }
  CUDNN_CHECK(d.finalize());
  return d;
}

// One engine configuration the heuristics proposed, with what its engine says of itself.
struct Candidate {
  BackendDesc cfg;
  int64_t engine = -1;   // cuDNN's global engine index (-1: not known)
  bool lowered = false;  // converts inputs down or reduces in lower precision
};

// The engine behind `cfg`: its global index and whether a numerical note says it computes
// in lower precision than asked. Unknown (-1, false) where cuDNN does not say.
void describe_engine(Candidate& c) {
  BackendDesc eng(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = eng.get();
  int64_t n = 0;
  if (cudnnBackendGetAttribute(c.cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               1, &n, &raw) != CUDNN_STATUS_SUCCESS)
    return;
  int64_t index = -1;
  if (cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index) ==
      CUDNN_STATUS_SUCCESS)
    c.engine = index;
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  if (cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) != CUDNN_STATUS_SUCCESS)
    return;
  for (int64_t i = 0; i < n && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; ++i)
    c.lowered |= notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS ||
                 notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION;
}

bool not_supported(cudnnStatus_t st) {
  return CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_NOT_SUPPORTED;
}

// A per-channel fp32 tensor (1, c, 1, 1).
BackendDesc channel_tensor(int64_t uid, int64_t c) {
  return nhwc_tensor(uid, CUDNN_DATA_FLOAT, 1, c, 1, 1);
}

// The convolution of `sh` (cross-correlation, fp32 accumulation), not yet finalized.
BackendDesc conv_descriptor(const ConvShape& sh) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  const int64_t pads[2] = {sh.pad, sh.pad}, strides[2] = {sh.stride, sh.stride}, dil[2] = {1, 1};
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  BackendDesc conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  conv.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, int64_t(2))
      .set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
      .set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pads)
      .set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pads)
      .set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, strides)
      .set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil);
  return conv;
}

// The operands of one run: tensors by unique id, and the workspace.
BackendDesc variant_pack(const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
                         void* workspace) {
  BackendDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(ptrs.size()), ptrs.data())
      .set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  CUDNN_CHECK(pack.finalize());
  return pack;
}

void check_aligned(const std::vector<void*>& ptrs) {
  for (const void* p : ptrs)
    SPOTRAIN_CHECK(p && (reinterpret_cast<uintptr_t>(p) & 15) == 0,
                   "internal: a fused cuDNN graph needs 16-byte aligned buffers");
}

// `d`, moved into `keep` (whose elements stay where they are as it grows).
BackendDesc& kept(std::deque<BackendDesc>& keep, BackendDesc d) {
  keep.push_back(std::move(d));
  return keep.back();
}

// One direction of the convolution as a graph operation: the attribute names of its
// descriptor type for its two inputs and its output, its convolution, alpha and beta.
struct ConvOpKind {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t in0, in1, out, conv, alpha, beta;
  const char* what;
};

const ConvOpKind& conv_op_kind(ConvDir dir) {
  static const ConvOpKind kinds[] = {
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, "convolution forward"},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, "convolution data gradient"},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, "convolution weight gradient"},
  };
  return kinds[int(dir)];
}

}  // namespace

// ---- FusedGraph ------------------------------------------------------------------------------

// plan(), an error while building (not a refusal) kept as the refusal: the other variant, or
// the search after a remembered choice, may still plan.
void FusedGraph::attempt(cudnnDataType_t inter, int only_candidate, int64_t only_engine) {
  try {
    plan(inter, only_candidate, only_engine);
  } catch (const Error& e) {
    plans_.clear();
    accepted_ = false;
    refusal_ = str("error: ", e.what());
  }
}

// A choice an earlier run made on this device ("<intermediates> intermediates, candidate C,
// engine E", choice_text's words): that plan alone, if the heuristics still propose its engine
// at the same place. False (nothing kept) where there is none or it no longer plans.
bool FusedGraph::plan_remembered(DType dt, bool retry_16bit) {
  const TuneVerdict* v = tuning_.autotune && tuning_.cache ? tuning_.cache->find(tuning_.key) : nullptr;
  char inter[16] = {};
  int candidate = -1;
  long long engine = -1;
  if (!v || std::sscanf(v->choice.c_str(), "%15s intermediates, candidate %d, engine %lld", inter,
                        &candidate, &engine) != 3 || candidate < 0 || engine < 0)
    return false;
  const std::string in = inter;
  if (in != "fp32" && !(retry_16bit && in == dtype_name(dt))) return false;
  attempt(in == "fp32" ? CUDNN_DATA_FLOAT : graph_dtype(dt), candidate, engine);
  if (!accepted_) {
    refusal_.clear();
    return false;
  }
  intermediates_ = in;
  how_ = v->ms > 0 ? "kernel cache: timed " + v->times() : std::string("kernel cache: the only engine that planned");
  return true;
}

void FusedGraph::spend(double seconds) {
  PlanBudget* b = tuning_.budget;
  if (!b) return;
  b->seconds += seconds;
  if (b->said_spent || b->rival_seconds < b->limit) return;
  b->said_spent = true;
  log_info(str("fused cuDNN graphs: planning took ", fmt_fixed(b->seconds, 1), " s for ", b->graphs,
               " graphs (", b->engines, " engines tried), ", fmt_fixed(b->rival_seconds, 1),
               " s of it on engines to time against the first, this run's budget of ",
               fmt_fixed(b->limit, 0), " s: the graphs planned from now on take the heuristics' "
               "first engine untimed (a restart times them)"));
}

void FusedGraph::plan_either(DType dt, bool retry_16bit) {
  const double t0 = now_seconds();
  budget_cut_ = false;
  if (plan_remembered(dt, retry_16bit)) {
    plan_seconds_ = now_seconds() - t0;
    spend(plan_seconds_);
    return;
  }
  attempt(CUDNN_DATA_FLOAT, -1, -1);
  if (!accepted_ && retry_16bit && dt != DType::f32) {
    const std::string first = refusal_;
    refusal_.clear();
    attempt(graph_dtype(dt), -1, -1);
    if (accepted_) intermediates_ = dtype_name(dt);
    else refusal_ = str("fp32 intermediates: ", first, "; ", dtype_name(dt), " intermediates: ", refusal_);
  }
  if (accepted_ && plans_.size() > 1) how_ = str(plans_.size(), " engines planned, to be timed at the first run");
  if (accepted_ && plans_.size() == 1 && budget_cut_) {
    // Not remembered: a restart, with a budget of its own, plans its rivals and times them.
    how_ = str("heuristics' first, untimed (this run's planning budget of ",
               fmt_fixed(tuning_.budget->limit, 0), " s was spent)");
  } else if (accepted_ && plans_.size() == 1) {
    how_ = tuning_.autotune ? "the only engine that planned" : "heuristics' first";
    // Remembered too: a restart then plans this engine alone instead of trying the others.
    if (tuning_.autotune && tuning_.cache && plans_.front().engine >= 0)
      tuning_.cache->put(tuning_.key, TuneVerdict{choice_text(plans_.front()), 0, "", 0});
  }
  plan_seconds_ = now_seconds() - t0;
  spend(plan_seconds_);
}

// bf16's scale and bias rounded to bf16 (8 significant bits) move x * scale + bias by up to
// about 2^-9 of its terms, while the data-gradient graph makes the batch norm's output again
// from fp32 statistics: an element that near zero took the other side of the ReLU there than
// in the forward. In fp32 the two agree to fp32 rounding. cuDNN's runtime-fusion engines take
// fp32 per-channel operands (the data-gradient graph's are); fp16 keeps fp16 ones, the
// operands of cuDNN's pre-compiled conv + batch-norm engines (cudnn-frontend's samples), with
// a band four times narrower (2^-11).
void FusedGraph::plan_prologue(DType dt) {
  scale_bias_ = dt == DType::bf16 ? DType::f32 : dt;
  plan_either(dt, true);
  if (accepted_ || scale_bias_ == dt) return;
  const std::string first = refusal_;
  const double first_seconds = plan_seconds_;
  refusal_.clear();
  scale_bias_ = dt;
  plan_either(dt, true);
  plan_seconds_ += first_seconds;
  if (!accepted_)
    refusal_ = str("fp32 scale and bias: ", first, "; ", dtype_name(dt), " scale and bias: ", refusal_);
}

size_t FusedGraph::workspace_bytes() const {
  size_t ws = 0;
  for (const Plan& p : plans_) ws = std::max(ws, p.workspace);
  return ws;
}

std::string FusedGraph::choice_text(const Plan& p) const {
  return str(intermediates_, " intermediates, candidate ", p.candidate, ", engine ", p.engine);
}

// The engine configurations cuDNN's heuristics propose for `graph` (mode A, then the fallback
// list), each engine once, those that keep the asked precision first; `why` says what failed
// when none.
static std::vector<Candidate> engine_candidates(const BackendDesc& graph, std::string& why) {
  std::vector<Candidate> clean, lowered;
  std::vector<int64_t> seen;
  why = "no engine proposed";
  for (cudnnBackendHeurMode_t hm : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    BackendDesc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hm);
    if (cudnnStatus_t st = heur.finalize(); st != CUDNN_STATUS_SUCCESS) {
      why = "heuristics: " + status_text(st);
      continue;
    }
    int64_t count = 0;
    if (cudnnStatus_t st = cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
        st != CUDNN_STATUS_SUCCESS || count <= 0) {
      why = st != CUDNN_STATUS_SUCCESS ? "heuristics results: " + status_text(st)
                                       : std::string("heuristics proposed no engine");
      continue;
    }
    std::vector<Candidate> got(static_cast<size_t>(count));
    std::vector<cudnnBackendDescriptor_t> raw;
    for (Candidate& c : got) {
      c.cfg = BackendDesc(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(c.cfg.get());
    }
    int64_t n = 0;
    if (cudnnStatus_t st = cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &n, raw.data());
        st != CUDNN_STATUS_SUCCESS) {
      why = "heuristics results: " + status_text(st);
      continue;
    }
    for (int64_t i = 0; i < n && i < count; ++i) {
      Candidate& c = got[size_t(i)];
      describe_engine(c);
      if (c.engine >= 0) {
        if (std::find(seen.begin(), seen.end(), c.engine) != seen.end()) continue;
        seen.push_back(c.engine);
      }
      (c.lowered ? lowered : clean).push_back(std::move(c));
    }
  }
  for (Candidate& c : lowered) clean.push_back(std::move(c));
  return clean;
}

void FusedGraph::plan(cudnnDataType_t inter, int only_candidate, int64_t only_engine) {
  // Every descriptor an operation refers to is kept until the plan is made, as cuDNN's
  // frontend keeps them.
  std::vector<BackendDesc> ops;
  std::deque<BackendDesc> keep;
  if (!build(inter, ops, keep)) return;
  BackendDesc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  std::vector<cudnnBackendDescriptor_t> raw_ops;
  for (const BackendDesc& o : ops) raw_ops.push_back(o.get());
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(raw_ops.size()), raw_ops.data())
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
  if (cudnnStatus_t st = graph.finalize(); st != CUDNN_STATUS_SUCCESS) {
    refusal_ = "operation graph: " + status_text(st);
    return;
  }
  // Plans are made in the heuristics' order: the first that finalizes alone, or with
  // autotuning up to kTimedPlans for the first run to time, while the run's planning budget
  // lasts (PlanBudget). Runtime-compiled engines compile as their plan finalizes (about a
  // second each): at most kMaxEngineTries are tried. An engine of lowered precision (last in
  // the list) only where no other planned.
  const bool search = tuning_.autotune && only_candidate < 0;
  budget_cut_ = search && tuning_.budget && tuning_.budget->rival_seconds >= tuning_.budget->limit;
  const size_t wanted = search && !budget_cut_ ? size_t(kTimedPlans) : 1;
  const size_t ws_limit = workspace_limit();
  std::string last;
  std::vector<Candidate> candidates = engine_candidates(graph, last);
  int tried = 0;
  double rivals_from = -1;  // when the first plan was made: what follows is the rivals'
  for (size_t i = 0; i < candidates.size(); ++i) {
    Candidate& c = candidates[i];
    if (only_candidate >= 0 && int(i) != only_candidate) continue;
    if (only_engine >= 0 && c.engine != only_engine) break;  // not what was remembered: search
    if (tried == kMaxEngineTries || (c.lowered && !plans_.empty())) break;
    ++tried;
    BackendDesc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_)
        .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, c.cfg);
    if (cudnnStatus_t st = plan.finalize(); st != CUDNN_STATUS_SUCCESS) {
      last = "execution plan: " + status_text(st);
      continue;
    }
    int64_t ws = 0, n = 0;
    CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                         CUDNN_TYPE_INT64, 1, &n, &ws));
    // A rival to time only where its workspace fits (its timing allocates a scratch buffer
    // of the largest candidate's workspace).
    if (!plans_.empty() && size_t(ws) > ws_limit) continue;
    Plan p;
    p.config = std::move(c.cfg);
    p.plan = std::move(plan);
    p.workspace = size_t(ws);
    p.engine = c.engine;
    p.lowered = c.lowered;
    p.candidate = int(i);
    plans_.push_back(std::move(p));
    if (plans_.size() == wanted) break;
    if (plans_.size() == 1) rivals_from = now_seconds();
  }
  if (tuning_.budget) {
    tuning_.budget->engines += tried;
    if (rivals_from >= 0) tuning_.budget->rival_seconds += now_seconds() - rivals_from;
  }
  if (!plans_.empty()) {
    accepted_ = true;
    return;
  }
  refusal_ = only_candidate >= 0 ? str("the remembered engine ", only_engine, " did not plan")
                                 : str(last, " (", tried, " of ", candidates.size(), " engines tried)");
}

// Times every plan on the operands of the first run (a warm-up run, then kRuns timed), keeps
// the fastest and remembers it; a plan that will not run is dropped (all: the error is thrown,
// and the caller refuses the graph). While a step is being recorded nothing can be timed: the
// first plan is kept.
void FusedGraph::time_plans(const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
                            const std::function<void()>& reset) {
  cudaStream_t stream = nullptr;
  CUDNN_CHECK(cudnnGetStream(handle_, &stream));
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    plans_.erase(plans_.begin() + 1, plans_.end());
    how_ = "heuristics' first (first run while recording a step)";
    return;
  }
  // The candidates run in a scratch buffer as large as the largest needs, freed once they are
  // timed (the stream waited for first): the caller's shared workspace, which a captured step
  // keeps for the whole run, grows only to the chosen plan's need. Without the memory for it,
  // the heuristics' first runs untimed.
  struct Scratch {
    void* p = nullptr;
    cudaStream_t stream;
    ~Scratch() {
      if (!p) return;
      CUDA_WARN(cudaStreamSynchronize(stream));
      CUDA_WARN(cudaFree(p));
    }
  } scratch{nullptr, stream};
  if (const size_t bytes = workspace_bytes(); bytes > 0 && cudaMalloc(&scratch.p, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    scratch.p = nullptr;
    plans_.erase(plans_.begin() + 1, plans_.end());
    how_ = str("heuristics' first (no ", (bytes + (1 << 20) - 1) >> 20, " MiB to time the candidates in)");
    return;
  }
  const BackendDesc pack = variant_pack(uids, ptrs, scratch.p);
  constexpr int kRuns = 3;
  cudaEvent_t from = nullptr, to = nullptr;
  if (cudaEventCreate(&from) != cudaSuccess || cudaEventCreate(&to) != cudaSuccess) {
    if (from) CUDA_WARN(cudaEventDestroy(from));
    (void)cudaGetLastError();
    plans_.erase(plans_.begin() + 1, plans_.end());
    how_ = "heuristics' first (no events to time with)";
    return;
  }
  std::vector<double> ms(plans_.size(), -1);
  std::string error;
  for (size_t i = 0; i < plans_.size(); ++i) {
    cudnnStatus_t st = cudnnBackendExecute(handle_, plans_[i].plan.get(), pack.get());
    bool timed = true;
    for (int r = 0; r < kRuns && st == CUDNN_STATUS_SUCCESS; ++r) {
      if (r == 0) timed = cudaEventRecord(from, stream) == cudaSuccess;
      st = cudnnBackendExecute(handle_, plans_[i].plan.get(), pack.get());
    }
    if (st != CUDNN_STATUS_SUCCESS) {
      (void)cudaGetLastError();  // a failed launch must not surface at a later kernel's check
      if (error.empty()) error = str("engine ", plans_[i].engine, ": ", status_text(st));
      continue;
    }
    float t = 0;
    if (timed && cudaEventRecord(to, stream) == cudaSuccess && cudaEventSynchronize(to) == cudaSuccess &&
        cudaEventElapsedTime(&t, from, to) == cudaSuccess) {
      ms[i] = double(t) / kRuns;
    } else {
      // Untimed, so not chosen; the event call's error cleared, as for a failed launch.
      (void)cudaGetLastError();
      if (error.empty()) error = str("engine ", plans_[i].engine, ": its runs could not be timed");
    }
  }
  CUDA_WARN(cudaEventDestroy(from));
  CUDA_WARN(cudaEventDestroy(to));
  int best = -1, second = -1, ran = 0;
  for (int i = 0; i < int(ms.size()); ++i) {
    if (ms[i] < 0) continue;
    ++ran;
    if (best < 0 || ms[i] < ms[best]) {
      second = best;
      best = i;
    } else if (second < 0 || ms[i] < ms[second]) {
      second = i;
    }
  }
  SPOTRAIN_CHECK(best >= 0, "no engine of the fused graph ran: ", error);
  TuneVerdict v{choice_text(plans_[best]), ms[best], "", 0};
  if (second >= 0) {
    v.runner_up = str("engine ", plans_[second].engine);
    v.runner_up_ms = ms[second];
  }
  how_ = str("timed ", ran, " engine", ran == 1 ? "" : "s", ": ", v.times());
  if (tuning_.cache) tuning_.cache->put(tuning_.key, std::move(v));
  Plan kept = std::move(plans_[size_t(best)]);
  plans_.clear();
  plans_.push_back(std::move(kept));
  if (reset) reset();
}

void FusedGraph::failed_to_run(const std::string& why) {
  accepted_ = false;
  refusal_ = "accepted, but its first run failed: " + why;
}

// cuDNN's verdict on one descriptor of the graph: a refusal (NOT_SUPPORTED, e.g. a dtype no
// engine family takes) is kept as the graph's answer; anything else is an error.
bool FusedGraph::finalized(BackendDesc& d, const char* what) {
  const cudnnStatus_t st = d.finalize();
  if (st == CUDNN_STATUS_SUCCESS) return true;
  if (!not_supported(st)) CUDNN_CHECK(st);
  refusal_ = str(what, ": ", status_text(st));
  return false;
}

bool FusedGraph::pointwise_op(cudnnPointwiseMode_t mode, const BackendDesc& x,
                              const BackendDesc* b, const BackendDesc& y,
                              std::vector<BackendDesc>& ops, std::deque<BackendDesc>& keep,
                              const char* what, float alpha2) {
  BackendDesc o(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  o.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, kept(keep, pointwise(mode)))
      .set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
  if (b) o.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
  if (alpha2 != 1.f) o.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &alpha2);
  if (!finalized(o, what)) return false;
  ops.push_back(std::move(o));
  return true;
}

bool FusedGraph::conv_op(ConvDir dir, const ConvShape& sh, const BackendDesc& in0,
                         const BackendDesc& in1, const BackendDesc& out,
                         std::vector<BackendDesc>& ops, std::deque<BackendDesc>& keep) {
  const ConvOpKind& kind = conv_op_kind(dir);
  BackendDesc& conv = kept(keep, conv_descriptor(sh));
  if (!finalized(conv, "convolution descriptor")) return false;
  const float alpha = 1.f, beta = 0.f;
  BackendDesc op(kind.type);
  op.set(kind.in0, in0)
      .set(kind.in1, in1)
      .set(kind.out, out)
      .set(kind.conv, conv)
      .set(kind.alpha, CUDNN_TYPE_FLOAT, 1, &alpha)
      .set(kind.beta, CUDNN_TYPE_FLOAT, 1, &beta);
  if (!finalized(op, kind.what)) return false;
  ops.push_back(std::move(op));
  return true;
}

const BackendDesc* FusedGraph::bn_relu_prologue(const ConvShape& sh, cudnnDataType_t inter,
                                                const BackendDesc& x,
                                                std::vector<BackendDesc>& ops,
                                                std::deque<BackendDesc>& keep) {
  const cudnnDataType_t dt = graph_dtype(scale_bias_);  // plan_prologue's choice
  const BackendDesc& scale = kept(keep, nhwc_tensor(kScale, dt, 1, sh.c, 1, 1));
  const BackendDesc& bias = kept(keep, nhwc_tensor(kBias, dt, 1, sh.c, 1, 1));
  const BackendDesc& scaled = kept(keep, nhwc_tensor(kScaled, inter, sh.n, sh.c, sh.h, sh.w, true));
  const BackendDesc& biased = kept(keep, nhwc_tensor(kBiased, inter, sh.n, sh.c, sh.h, sh.w, true));
  const BackendDesc& out = kept(keep, nhwc_tensor(kActivated, inter, sh.n, sh.c, sh.h, sh.w, true));
  const bool ok =
      pointwise_op(CUDNN_POINTWISE_MUL, x, &scale, scaled, ops, keep, "prologue scale") &&
      pointwise_op(CUDNN_POINTWISE_ADD, scaled, &bias, biased, ops, keep, "prologue bias") &&
      pointwise_op(CUDNN_POINTWISE_RELU_FWD, biased, nullptr, out, ops, keep, "prologue ReLU");
  return ok ? &out : nullptr;
}

void FusedGraph::execute(const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
                         const WorkspaceFn& workspace, const std::function<void()>& reset) {
  SPOTRAIN_CHECK(accepted_, "internal: running a fused graph cuDNN refused: ", refusal_);
  check_aligned(ptrs);
  if (plans_.size() > 1) time_plans(uids, ptrs, reset);
  const BackendDesc pack = variant_pack(uids, ptrs, workspace(plans_.front().workspace));
  CUDNN_CHECK(cudnnBackendExecute(handle_, plans_.front().plan.get(), pack.get()));
}

// ---- ConvStatsGraph: [relu(x * scale + bias)] -> conv -> y [, GenStats(y)] -----------------

ConvStatsGraph::ConvStatsGraph(cudnnHandle_t handle, const ConvShape& sh, bool bn_relu_prologue,
                               bool with_stats, GraphTuning tuning)
    : FusedGraph(handle, std::move(tuning)), sh_(sh), prologue_(bn_relu_prologue), stats_(with_stats) {
  if (prologue_)
    plan_prologue(sh.dtype);
  else
    plan_either(sh.dtype, false);
}

bool ConvStatsGraph::build(cudnnDataType_t inter, std::vector<BackendDesc>& ops,
                           std::deque<BackendDesc>& keep) {
  const ConvShape& sh = sh_;
  const cudnnDataType_t dt = graph_dtype(sh.dtype), f32 = CUDNN_DATA_FLOAT;
  const BackendDesc& x = kept(keep, nhwc_tensor(kX, dt, sh.n, sh.c, sh.h, sh.w));
  const BackendDesc* in = prologue_ ? bn_relu_prologue(sh, inter, x, ops, keep) : &x;
  if (!in) return false;
  const BackendDesc& w = kept(keep, nhwc_tensor(kW, dt, sh.k, sh.c, sh.r, sh.s));
  const BackendDesc& y = kept(keep, nhwc_tensor(kY, dt, sh.n, sh.k, sh.p(), sh.q()));
  if (!conv_op(ConvDir::forward, sh, *in, w, y, ops, keep)) return false;
  if (!stats_) return true;

  const BackendDesc& sum = kept(keep, channel_tensor(kSum, sh.k));
  const BackendDesc& sqsum = kept(keep, channel_tensor(kSqSum, sh.k));
  const cudnnGenStatsMode_t gmode = CUDNN_GENSTATS_SUM_SQSUM;
  BackendDesc stats(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR);
  stats.set(CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &gmode)
      .set(CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f32)
      .set(CUDNN_ATTR_OPERATION_GENSTATS_XDESC, y)
      .set(CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, sum)
      .set(CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, sqsum);
  if (!finalized(stats, "GenStats")) return false;
  ops.push_back(std::move(stats));
  return true;
}

void ConvStatsGraph::run(const void* x, const void* w, void* y, float* sum, float* sqsum,
                         const WorkspaceFn& workspace, const void* scale, const void* bias) {
  SPOTRAIN_CHECK(!prologue_ || (scale && bias), "internal: the prologue needs a scale and a bias");
  std::vector<void*> ptrs = {const_cast<void*>(x), const_cast<void*>(w), y};
  std::vector<int64_t> uids = {kX, kW, kY};
  if (stats_) {
    ptrs.push_back(sum);
    ptrs.push_back(sqsum);
    uids.push_back(kSum);
    uids.push_back(kSqSum);
  }
  if (prologue_) {
    ptrs.push_back(const_cast<void*>(scale));
    ptrs.push_back(const_cast<void*>(bias));
    uids.push_back(kScale);
    uids.push_back(kBias);
  }
  // The statistics start from the zeros the caller set: the timing's runs may have added to
  // them (GenStats is not documented to overwrite).
  auto zero_sums = [&] {
    if (!stats_) return;
    cudaStream_t stream = nullptr;
    CUDNN_CHECK(cudnnGetStream(handle_, &stream));
    CUDA_CHECK(cudaMemsetAsync(sum, 0, size_t(sh_.k) * sizeof(float), stream));
    CUDA_CHECK(cudaMemsetAsync(sqsum, 0, size_t(sh_.k) * sizeof(float), stream));
  };
  execute(uids, ptrs, workspace, zero_sums);
}

// ---- ConvWgradGraph: relu(x * scale + bias), dy -> conv weight gradient ---------------------

ConvWgradGraph::ConvWgradGraph(cudnnHandle_t handle, const ConvShape& sh, GraphTuning tuning)
    : FusedGraph(handle, std::move(tuning)), sh_(sh) {
  plan_prologue(sh.dtype);
}

bool ConvWgradGraph::build(cudnnDataType_t inter, std::vector<BackendDesc>& ops,
                           std::deque<BackendDesc>& keep) {
  const ConvShape& sh = sh_;
  const cudnnDataType_t dt = graph_dtype(sh.dtype);
  const BackendDesc* in =
      bn_relu_prologue(sh, inter, kept(keep, nhwc_tensor(kX, dt, sh.n, sh.c, sh.h, sh.w)), ops, keep);
  if (!in) return false;
  const BackendDesc& dy = kept(keep, nhwc_tensor(kDy, dt, sh.n, sh.k, sh.p(), sh.q()));
  const BackendDesc& dw = kept(keep, nhwc_tensor(kDw, dt, sh.k, sh.c, sh.r, sh.s));
  return conv_op(ConvDir::filter, sh, *in, dy, dw, ops, keep);
}

void ConvWgradGraph::run(const void* x, const void* dy, void* dw, const void* scale,
                         const void* bias, const WorkspaceFn& workspace) {
  execute({kX, kDy, kDw, kScale, kBias},
          {const_cast<void*>(x), const_cast<void*>(dy), dw, const_cast<void*>(scale),
           const_cast<void*>(bias)},
          workspace);
}

// ---- DgradDreluDbnGraph: dgrad -> ReLU backward (mask from bn(x)) -> BN weight gradients ----

DgradDreluDbnGraph::DgradDreluDbnGraph(cudnnHandle_t handle, const ConvShape& sh, GraphTuning tuning)
    : FusedGraph(handle, std::move(tuning)), sh_(sh) {
  plan_either(sh.dtype, true);
}

bool DgradDreluDbnGraph::build(cudnnDataType_t inter, std::vector<BackendDesc>& ops,
                               std::deque<BackendDesc>& keep) {
  const ConvShape& sh = sh_;
  const cudnnDataType_t dt = graph_dtype(sh.dtype), f32 = CUDNN_DATA_FLOAT;
  const BackendDesc& dy = kept(keep, nhwc_tensor(kDy, dt, sh.n, sh.k, sh.p(), sh.q()));
  const BackendDesc& w = kept(keep, nhwc_tensor(kW, dt, sh.k, sh.c, sh.r, sh.s));
  const BackendDesc& x = kept(keep, nhwc_tensor(kX, dt, sh.n, sh.c, sh.h, sh.w));
  const BackendDesc& mean = kept(keep, channel_tensor(kMean, sh.c));
  const BackendDesc& invstd = kept(keep, channel_tensor(kInvStd, sh.c));
  const BackendDesc& gamma = kept(keep, channel_tensor(kGamma, sh.c));
  const BackendDesc& beta = kept(keep, channel_tensor(kBeta, sh.c));
  const BackendDesc& g = kept(keep, nhwc_tensor(kG, dt, sh.n, sh.c, sh.h, sh.w));
  const BackendDesc& dgamma = kept(keep, channel_tensor(kDgamma, sh.c));
  const BackendDesc& dbeta = kept(keep, channel_tensor(kDbeta, sh.c));
  const BackendDesc& eq_dy = kept(keep, channel_tensor(kEqDy, sh.c));
  const BackendDesc& eq_x = kept(keep, channel_tensor(kEqX, sh.c));
  const BackendDesc& eq_bias = kept(keep, channel_tensor(kEqBias, sh.c));
  auto inner = [&](int64_t uid) -> const BackendDesc& {
    return kept(keep, nhwc_tensor(uid, inter, sh.n, sh.c, sh.h, sh.w, true));
  };
  const BackendDesc& dgrad_out = inner(kDgradOut);
  const BackendDesc& centered = inner(kCentered);
  const BackendDesc& normed = inner(kNormed);
  const BackendDesc& gammaed = inner(kGammaed);
  const BackendDesc& bn_out = inner(kBnOut);
  if (!conv_op(ConvDir::data, sh, dy, w, dgrad_out, ops, keep)) return false;
  // The batch norm's output made again, for the ReLU's mask.
  if (!pointwise_op(CUDNN_POINTWISE_ADD, x, &mean, centered, ops, keep, "x - mean", -1.f) ||
      !pointwise_op(CUDNN_POINTWISE_MUL, centered, &invstd, normed, ops, keep, "* invstd") ||
      !pointwise_op(CUDNN_POINTWISE_MUL, normed, &gamma, gammaed, ops, keep, "* gamma") ||
      !pointwise_op(CUDNN_POINTWISE_ADD, gammaed, &beta, bn_out, ops, keep, "+ beta"))
    return false;
  BackendDesc drelu(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  drelu.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, kept(keep, pointwise(CUDNN_POINTWISE_RELU_BWD)))
      .set(CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, dgrad_out)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, bn_out)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_DXDESC, g);
  if (!finalized(drelu, "ReLU backward")) return false;
  ops.push_back(std::move(drelu));
  BackendDesc bnw(CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR);
  bnw.set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f32)
      .set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MEAN_DESC, mean)
      .set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC, invstd)
      .set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC, gamma)
      .set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC, x)
      .set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC, g)
      .set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC, dgamma)
      .set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC, dbeta)
      .set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC, eq_dy)
      .set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC, eq_x)
      .set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_BIAS, eq_bias);
  if (!finalized(bnw, "batch-norm weight gradients")) return false;
  ops.push_back(std::move(bnw));
  return true;
}

void DgradDreluDbnGraph::run(const Args& a, const WorkspaceFn& workspace) {
  auto p = [](const void* q) { return const_cast<void*>(q); };
  execute({kDy, kW, kX, kMean, kInvStd, kGamma, kBeta, kG, kDgamma, kDbeta, kEqDy, kEqX, kEqBias},
          {p(a.dy), p(a.w), p(a.x), p(a.mean), p(a.invstd), p(a.gamma), p(a.beta), a.g, a.dgamma,
           a.dbeta, a.eq_dy, a.eq_x, a.eq_bias},
          workspace);
}

}  // namespace spotrain::cuda
