// CUDA backend: cuDNN convolution (forward, backward-data, backward-filter; algorithm chosen
// once per shape by measurement, or by cuDNN's heuristics restricted to deterministic
// algorithms under --deterministic), the weights' compute copies, and backward-data added into
// a gradient in one pass (beta = 1). cuDNN 9 still ships these legacy entry points (deprecated
// in favour of the graph API).
#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "core/log.h"
#include "kernels/cuda/cuda_entries.h"
#include "kernels/cuda/cuda_util.h"

namespace spotrain::cuda {

namespace {

const float kOne = 1.f, kZero = 0.f;

// Picks an algorithm from perf results (sorted best first): the first that ran, fits the
// workspace limit, is deterministic when asked, and (strict fp32) does not use tensor cores.
template <typename Perf>
const Perf* pick(const Perf* perf, int count, size_t limit, bool deterministic, bool strict) {
  for (int i = 0; i < count; ++i) {
    const Perf& r = perf[i];
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > limit) continue;
    if (deterministic && r.determinism != CUDNN_DETERMINISTIC) continue;
    if (strict &&
        (r.mathType == CUDNN_TENSOR_OP_MATH || r.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
      continue;
    return &r;
  }
  return nullptr;
}

// How an algorithm is to be chosen, and where the choice is remembered.
struct AlgoSearch {
  bool deterministic = false;  // cuDNN's heuristics, restricted to deterministic algorithms
  bool strict = false;         // fp32 without tensor cores
  bool autotune = true;        // timed (FindEx); else the heuristics' first choice
  KernelCache* cache = nullptr;
  std::string shape;           // the shape and math; with the direction, the key in the cache
  std::string how;             // out: how the algorithm was chosen, for --profile
};

// The search for a shape (`key`, conv_cache_'s) computed with `math`, as the options ask.
AlgoSearch algo_search(const BackendOptions& o, KernelCache* cache, const std::string& key,
                       cudnnMathType_t math, bool strict) {
  return AlgoSearch{o.deterministic, strict, o.autotune, cache, str(key, " math ", int(math)), ""};
}

// An algorithm and its math, as the kernel cache keeps it ("algo 1 math 1").
template <typename Perf>
std::string algo_text(const Perf& r) {
  return str("algo ", int(r.algo), " math ", int(r.mathType));
}

// Chooses an algorithm: under --deterministic, cuDNN's heuristics (the same choice every run);
// otherwise the one timed fastest (FindEx, with a workspace as large as the best candidates
// need), taken from the kernel cache where an earlier run timed this shape on this device.
// get_v7(n, &returned, perf) and find_ex(n, &returned, perf, ws, ws_bytes) wrap the calls.
template <typename Perf, int kCount, typename GetV7, typename FindEx>
Perf choose_algo(AlgoSearch& s, const char* what, GetV7 get_v7, FindEx find_ex) {
  const bool deterministic = s.deterministic, strict = s.strict;
  const std::string key = str(what, " ", s.shape);
  // Room for more results than the enum names: newer cuDNN builds may report extra entries.
  constexpr int kRoom = 2 * kCount + 8;
  Perf perf[kRoom];
  int got = 0;
  size_t limit = workspace_limit();
  CUDNN_CHECK(get_v7(kRoom, &got, perf));
  // Remembered: the same algorithm, if the heuristics still list it as runnable here, run
  // with the math it was timed in. Matched on the algorithm alone: FindEx reports the math an
  // algorithm ran in, which the heuristics may list under another type (an entry matched on
  // both never matched, and the shape was timed again at every start).
  if (!deterministic && s.autotune && s.cache) {
    if (const TuneVerdict* v = s.cache->find(key)) {
      int algo = -1, math = -1;
      if (std::sscanf(v->choice.c_str(), "algo %d math %d", &algo, &math) == 2 && algo >= 0 && math >= 0) {
        for (int i = 0; i < got; ++i) {
          const Perf* r = pick(perf + i, 1, limit, false, strict);
          if (r && int(r->algo) == algo) {
            Perf chosen = *r;
            chosen.mathType = cudnnMathType_t(math);
            s.how = "kernel cache: timed " + v->times();
            return chosen;
          }
        }
      }
    }
  }
  if (!deterministic && s.autotune) {
    size_t want = 0;
    for (int i = 0; i < got; ++i)
      if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= limit)
        want = std::max(want, perf[i].memory);
    void* ws = nullptr;
    // A transient buffer outside the caching allocator: measured once per shape. Where it
    // cannot be had, only the algorithms needing no workspace are timed: a choice for this run
    // alone, not remembered (the kernel cache would keep it for good).
    bool partial = false;
    if (want > 0 && cudaMalloc(&ws, want) != cudaSuccess) {
      (void)cudaGetLastError();
      ws = nullptr;
      want = 0;
      partial = true;
    }
    Perf found[kRoom];
    int nfound = 0;
    cudnnStatus_t st = find_ex(kRoom, &nfound, found, ws, want);
    if (ws) (void)cudaFree(ws);
    CUDNN_CHECK(st);
    if (const Perf* r = pick(found, nfound, want, false, strict)) {
      TuneVerdict v{algo_text(*r), double(r->time), "", 0};
      const int next = int(r - found) + 1;
      if (const Perf* q = next < nfound ? pick(found + next, nfound - next, want, false, strict) : nullptr) {
        v.runner_up = algo_text(*q);
        v.runner_up_ms = double(q->time);
      }
      s.how = "timed " + v.times();
      if (partial)
        s.how += " (without a workspace, which could not be allocated: not remembered)";
      else if (s.cache)
        s.cache->put(key, std::move(v));
      return *r;
    }
  }
  s.how = deterministic ? "heuristics, deterministic" : "heuristics";
  if (const Perf* r = pick(perf, got, limit, deterministic, strict)) return *r;
  // No deterministic algorithm for this shape (some NHWC directions have only
  // non-deterministic kernels): run, and say once that this shape breaks bitwise repeatability.
  if (deterministic) {
    if (const Perf* r = pick(perf, got, limit, false, strict)) {
      static bool said = false;
      if (!said)
        std::fprintf(stderr,
                     "warning: cuDNN has no deterministic %s algorithm for a shape of this model; "
                     "it uses a non-deterministic one (runs may differ in the last bits)\n",
                     what);
      said = true;
      return *r;
    }
  }
  SPOTRAIN_THROW("cuDNN offers no ", deterministic ? "deterministic " : "", what,
                 " algorithm for this shape", strict ? " in strict fp32" : "",
                 deterministic ? "; try without --deterministic" : "");
}

// A bf16/fp16 convolution direction without a cuDNN algorithm (e.g. a stem with 1 or 3 input
// channels on some cuDNN builds): say so once; the caller computes it in fp32 instead.
void note_f32_fallback(const char* what, const Tensor& x, const Error& err) {
  std::fprintf(stderr, "note: convolution %s on %s runs in fp32: %s\n", what, x.describe().c_str(),
               err.what());
}

}  // namespace

// ---- convolution ----------------------------------------------------------------------------

cudnnMathType_t CudaBackend::conv_math(DType dt) const {
  if (dt != DType::f32) return CUDNN_TENSOR_OP_MATH;
  // fp32: FMA only (no TF32) unless tf32 was asked for; DEFAULT_MATH lets cuDNN use TF32
  // tensor cores on Ampere and later but never converts to fp16/bf16.
  return opt_.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

// Choosing algorithms runs and times kernels, which a step being recorded cannot do: the
// eager steps before a capture (StepRunner's warm-up) meet every shape first.
constexpr const char* kNewShapeWhileCapturing =
    "internal: a convolution shape first met while capturing a step (--cuda-graph)";

// The convolution part of kernel_choices(): per shape, the algorithm of each direction that
// ran (cuDNN's enum value), its math and workspace, the fp32 fallbacks, and the verdict on
// each fusion graph --fusion bn planned for the shape (engine, workspace, planning time,
// whether it ran, or why cuDNN refused it). Nothing is planned here: without --fusion bn no
// graph is named.
std::vector<std::string> CudaBackend::conv_choices() const {
  auto math = [](cudnnMathType_t m) {
    return m == CUDNN_DEFAULT_MATH ? "default math" : m == CUDNN_FMA_MATH ? "fma" : "tensor ops";
  };
  auto dir = [&](const char* what, bool have, int algo, cudnnMathType_t m, size_t ws, bool f32,
                 const std::string& how) {
    if (!have) return str(what, " unused");
    return str(what, " algo ", algo, " (", math(m), ", ", (ws + (1 << 20) - 1) >> 20, " MiB",
               f32 ? ", fp32 fallback" : "", how.empty() ? std::string() : ", " + how, ")");
  };
  auto verdict = [&](const ConvEntry& e, int which) -> std::string {
    const FusedGraph& g = *e.fused[which];
    const char* name = fusion_graph_name(which);
    const std::string planned = str(", planned in ", fmt_fixed(g.plan_seconds(), 2), " s");
    return g.accepted() ? str(", ", name, " graph: accepted (engine ", g.engine(),
                              g.lowered_precision() ? " of lowered precision" : "", ", ", g.how(), ", ",
                              (g.workspace_bytes() + (1 << 20) - 1) >> 20, " MiB",
                              which != kStatsGraph ? str(", ", g.intermediates(), " intermediates") : std::string(),
                              which != kStatsGraph && which != kDgradGraph
                                  ? str(", ", dtype_name(g.scale_bias_dtype()), " scale and bias")
                                  : std::string(),
                              planned, e.fused_ran[which] ? ", ran" : "", ")")
                        : str(", ", name, " graph: refused (", g.refusal(), planned, ")");
  };
  auto fusion = [&](const ConvEntry& e) {
    std::string v;
    for (int which = 0; which < kFusionGraphs; ++which)
      if (e.fused[which]) v += verdict(e, which);
    return v;
  };
  std::vector<std::string> out;
  for (auto& [key, e] : conv_cache_)
    out.push_back(str("conv ", key, ": ",
                      dir("forward", e->have_fwd, int(e->fwd_algo), e->fwd_math, e->fwd_ws, e->fwd_f32, e->fwd_how), ", ",
                      dir("data", e->have_bd, int(e->bd_algo), e->bd_math, e->bd_ws, e->bd_f32, e->bd_how),
                      e->bd_add_refused ? " (refuses beta = 1)" : "", ", ",
                      dir("filter", e->have_bw, int(e->bw_algo), e->bw_math, e->bw_ws, e->bw_f32, e->bw_how),
                      fusion(*e)));
  return out;
}

CudaBackend::ConvEntry& CudaBackend::conv_entry(const Tensor& x, const Tensor& w,
                                                const ConvParams& p) {
  std::string key =
      key_of(x) + "|" + key_of(w) + "|" + std::to_string(p.stride) + "," + std::to_string(p.pad);
  auto it = conv_cache_.find(key);
  if (it != conv_cache_.end()) return *it->second;
  SPOTRAIN_CHECK(!capturing_, kNewShapeWhileCapturing);
  SPOTRAIN_CHECK(w.ndim() == 4 && w.dim(1) == x.dim(1) && w.dim(2) == p.kh && w.dim(3) == p.kw,
                 "conv2d: input ", x.describe(), " does not match weights ", w.describe());
  auto e = std::make_unique<ConvEntry>();
  DType dt = x.dtype();
  e->x = nhwc_desc(dt, x.dim(0), x.dim(1), x.dim(2), x.dim(3));
  CUDNN_CHECK(cudnnCreateFilterDescriptor(&e->w));
  CUDNN_CHECK(cudnnSetFilter4dDescriptor(e->w, dnn_dtype(dt), CUDNN_TENSOR_NHWC, int(w.dim(0)),
                                         int(w.dim(1)), int(w.dim(2)), int(w.dim(3))));
  CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&e->conv));
  CUDNN_CHECK(cudnnSetConvolution2dDescriptor(e->conv, p.pad, p.pad, p.stride, p.stride, 1, 1,
                                              CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CUDNN_CHECK(cudnnSetConvolutionMathType(e->conv, conv_math(dt)));
  int n = 0, c = 0, h = 0, wd = 0;
  CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(e->conv, e->x, e->w, &n, &c, &h, &wd));
  SPOTRAIN_CHECK(h > 0 && wd > 0, "conv2d: input ", x.describe(), " is smaller than the kernel");
  e->oh = h;
  e->ow = wd;
  e->y = nhwc_desc(dt, n, c, h, wd);
  e->shape = ConvShape{dt, x.dim(0), x.dim(1), x.dim(2), x.dim(3), w.dim(0), w.dim(2), w.dim(3),
                       p.stride, p.pad};
  e->key = key;
  auto& ref = *e;
  conv_cache_.emplace(key, std::move(e));
  return ref;
}

const void* CudaBackend::weights_as(const Tensor& w, DType dt) {
  SPOTRAIN_CHECK(w.dtype() == DType::f32 && w.ndim() == 4 && w.device() == Device::cuda,
                 "conv2d: weights must be fp32 OIHW on the GPU, got ", w.describe());
  auto& copies = weight_copies_[w.raw()];
  WeightCopy* wc = nullptr;
  for (auto& c : copies)
    if (c.dt == dt && c.data.shape() == w.shape()) wc = &c;
  if (!wc) {  // (a same-address copy of another shape belonged to a freed tensor)
    copies.erase(std::remove_if(copies.begin(), copies.end(),
                                [&](const WeightCopy& c) { return c.dt == dt; }),
                 copies.end());
    copies.push_back(WeightCopy{dt, Tensor(w.shape(), dt, allocator(), Layout::nhwc), 0});
    wc = &copies.back();
  }
  if (wc->version != w.version()) {
    launch_oihw_to_ohwi(w.data<float>(), wc->data.raw(), dt, int(w.dim(0)), int(w.dim(1)),
                        int(w.dim(2)), int(w.dim(3)), compute_);
    wc->version = w.version();
  }
  return wc->data.raw();
}

Tensor CudaBackend::conv2d_forward_impl(const Tensor& x, const Tensor& w, const ConvParams& p) {
  check_activation(x, "conv2d");
  auto& e = conv_entry(x, w, p);
  if (e.fwd_f32) return cast(conv2d_forward(cast(x, DType::f32), w, p), x.dtype());
  const void* wp = weights_as(w, x.dtype());
  Tensor y = alloc({x.dim(0), w.dim(0), e.oh, e.ow}, x.dtype(), Layout::nhwc);
  bool strict = x.dtype() == DType::f32 && !opt_.tf32;
  if (!e.have_fwd) {
    SPOTRAIN_CHECK(!capturing_, kNewShapeWhileCapturing);
    try {
      CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, conv_math(x.dtype())));
      AlgoSearch search = algo_search(opt_, kernel_cache_.get(), e.key, conv_math(x.dtype()), strict);
      auto r = choose_algo<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT>(
          search, "convolution forward",
          [&](int n, int* got, cudnnConvolutionFwdAlgoPerf_t* perf) {
            return cudnnGetConvolutionForwardAlgorithm_v7(dnn_, e.x, e.w, e.conv, e.y, n, got,
                                                          perf);
          },
          [&](int n, int* got, cudnnConvolutionFwdAlgoPerf_t* perf, void* ws, size_t bytes) {
            return cudnnFindConvolutionForwardAlgorithmEx(dnn_, e.x, x.raw(), e.w, wp, e.conv, e.y,
                                                          y.raw(), n, got, perf, ws, bytes);
          });
      e.fwd_algo = r.algo;
      e.fwd_how = search.how;
      e.fwd_math = strict ? CUDNN_FMA_MATH : r.mathType;
      CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, e.fwd_math));
      CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(dnn_, e.x, e.w, e.conv, e.y, e.fwd_algo,
                                                          &e.fwd_ws));
      e.have_fwd = true;
    } catch (const Error& err) {
      if (x.dtype() == DType::f32) throw;
      note_f32_fallback("forward", x, err);
      e.fwd_f32 = true;
      return cast(conv2d_forward(cast(x, DType::f32), w, p), x.dtype());
    }
  }
  CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, e.fwd_math));
  CUDNN_CHECK(cudnnConvolutionForward(dnn_, &kOne, e.x, x.raw(), e.w, wp, e.conv, e.fwd_algo,
                                      workspace(e.fwd_ws), e.fwd_ws, &kZero, e.y, y.raw()));
  return y;
}

bool CudaBackend::backward_data_into(const Tensor& dy, const Tensor& w, const Tensor& x,
                                     const ConvParams& p, Tensor& dx, float beta) {
  check_activation(x, "conv2d_backward_data");
  check_activation(dy, "conv2d_backward_data");
  auto& e = conv_entry(x, w, p);
  SPOTRAIN_CHECK(dy.dtype() == x.dtype() && dy.dim(0) == x.dim(0) && dy.dim(1) == w.dim(0) &&
                     dy.dim(2) == e.oh && dy.dim(3) == e.ow,
                 "conv2d_backward_data: gradient ", dy.describe(), " does not match the output");
  if (e.bd_f32 || (beta != 0.f && e.bd_add_refused)) return false;
  const void* wp = weights_as(w, x.dtype());
  bool strict = x.dtype() == DType::f32 && !opt_.tf32;
  if (!e.have_bd) {
    SPOTRAIN_CHECK(!capturing_, kNewShapeWhileCapturing);
    // The search writes its trial results into a buffer of dx's size: not into dx itself when
    // dx holds a gradient to add to.
    Tensor trial = beta != 0.f ? alloc_like(x) : dx;
    try {
      CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, conv_math(x.dtype())));
      AlgoSearch search = algo_search(opt_, kernel_cache_.get(), e.key, conv_math(x.dtype()), strict);
      auto r =
          choose_algo<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT>(
              search, "convolution backward-data",
              [&](int n, int* got, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
                return cudnnGetConvolutionBackwardDataAlgorithm_v7(dnn_, e.w, e.y, e.conv, e.x, n,
                                                                   got, perf);
              },
              [&](int n, int* got, cudnnConvolutionBwdDataAlgoPerf_t* perf, void* ws,
                  size_t bytes) {
                return cudnnFindConvolutionBackwardDataAlgorithmEx(
                    dnn_, e.w, wp, e.y, dy.raw(), e.conv, e.x, trial.raw(), n, got, perf, ws,
                    bytes);
              });
      e.bd_algo = r.algo;
      e.bd_how = search.how;
      e.bd_math = strict ? CUDNN_FMA_MATH : r.mathType;
      CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, e.bd_math));
      CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(dnn_, e.w, e.y, e.conv, e.x,
                                                               e.bd_algo, &e.bd_ws));
      e.have_bd = true;
    } catch (const Error& err) {
      if (x.dtype() == DType::f32) throw;
      note_f32_fallback("backward-data", x, err);
      e.bd_f32 = true;
      return false;
    }
  }
  CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, e.bd_math));
  const cudnnStatus_t st = cudnnConvolutionBackwardData(
      dnn_, &kOne, e.w, wp, e.y, dy.raw(), e.conv, e.bd_algo, workspace(e.bd_ws), e.bd_ws,
      beta != 0.f ? &kOne : &kZero, e.x, dx.raw());
  if (st == CUDNN_STATUS_NOT_SUPPORTED && beta != 0.f) {  // checked before it runs: dx is as it was
    e.bd_add_refused = true;
    std::fprintf(stderr, "note: convolution backward-data on %s cannot add into its gradient "
                 "(%s): computed apart and added\n", x.describe().c_str(), cudnnGetErrorString(st));
    return false;
  }
  CUDNN_CHECK(st);
  return true;
}

Tensor CudaBackend::conv2d_backward_data_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                              const ConvParams& p) {
  Tensor dx = alloc_like(x);
  if (backward_data_into(dy, w, x, p, dx, 0.f)) return dx;
  return cast(conv2d_backward_data(cast(dy, DType::f32), w, cast(x, DType::f32), p), x.dtype());
}

void CudaBackend::conv2d_backward_data_add_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                                const ConvParams& p, Tensor& acc) {
  check_activation(acc, "conv2d_backward_data_add");
  SPOTRAIN_CHECK(acc.shape() == x.shape() && acc.dtype() == x.dtype(),
                 "conv2d_backward_data_add: gradient ", acc.describe(), " does not match the input ",
                 x.describe());
  // Where this shape runs in fp32, or its algorithm cannot add: the data gradient apart, then
  // the Add (the composed op; the public one would come back here).
  if (!backward_data_into(dy, w, x, p, acc, 1.f))
    composed_conv2d_backward_data_add(dy, w, x, p, acc);
}

void CudaBackend::conv2d_backward_weights_impl(const Tensor& x, const Tensor& dy, const ConvParams& p,
                                               Tensor& dw) {
  check_activation(x, "conv2d_backward_weights");
  check_activation(dy, "conv2d_backward_weights");
  SPOTRAIN_CHECK(dw.dtype() == DType::f32 && dw.ndim() == 4 && dw.device() == Device::cuda,
                 "conv2d: weight gradient must be fp32 OIHW on the GPU, got ", dw.describe());
  auto& e = conv_entry(x, dw, p);
  SPOTRAIN_CHECK(dy.dtype() == x.dtype() && dy.dim(0) == x.dim(0) && dy.dim(1) == dw.dim(0) &&
                     dy.dim(2) == e.oh && dy.dim(3) == e.ow,
                 "conv2d_backward_weights: gradient ", dy.describe(), " does not match the output");
  if (e.bw_f32) return conv2d_backward_weights(cast(x, DType::f32), cast(dy, DType::f32), p, dw);
  // cuDNN writes the gradient in the filter's (O, H, W, I) layout and the compute dtype; our
  // kernel then transposes it into the fp32 OIHW gradient.
  Tensor tmp(dw.shape(), x.dtype(), allocator(), Layout::nhwc);
  bool strict = x.dtype() == DType::f32 && !opt_.tf32;
  if (!e.have_bw) {
    SPOTRAIN_CHECK(!capturing_, kNewShapeWhileCapturing);
    try {
      CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, conv_math(x.dtype())));
      AlgoSearch search = algo_search(opt_, kernel_cache_.get(), e.key, conv_math(x.dtype()), strict);
      auto r =
          choose_algo<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT>(
              search, "convolution backward-filter",
              [&](int n, int* got, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
                return cudnnGetConvolutionBackwardFilterAlgorithm_v7(dnn_, e.x, e.y, e.conv, e.w, n,
                                                                     got, perf);
              },
              [&](int n, int* got, cudnnConvolutionBwdFilterAlgoPerf_t* perf, void* ws,
                  size_t bytes) {
                return cudnnFindConvolutionBackwardFilterAlgorithmEx(
                    dnn_, e.x, x.raw(), e.y, dy.raw(), e.conv, e.w, tmp.raw(), n, got, perf, ws,
                    bytes);
              });
      e.bw_algo = r.algo;
      e.bw_how = search.how;
      e.bw_math = strict ? CUDNN_FMA_MATH : r.mathType;
      CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, e.bw_math));
      CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn_, e.x, e.y, e.conv, e.w,
                                                                 e.bw_algo, &e.bw_ws));
      e.have_bw = true;
    } catch (const Error& err) {
      if (x.dtype() == DType::f32) throw;
      note_f32_fallback("backward-filter", x, err);
      e.bw_f32 = true;
      return conv2d_backward_weights(cast(x, DType::f32), cast(dy, DType::f32), p, dw);
    }
  }
  CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, e.bw_math));
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(dnn_, &kOne, e.x, x.raw(), e.y, dy.raw(), e.conv,
                                             e.bw_algo, workspace(e.bw_ws), e.bw_ws, &kZero, e.w,
                                             tmp.raw()));
  launch_ohwi_to_oihw(tmp.raw(), x.dtype(), dw.data<float>(), int(dw.dim(0)), int(dw.dim(1)),
                      int(dw.dim(2)), int(dw.dim(3)), compute_);
}

}  // namespace spotrain::cuda
