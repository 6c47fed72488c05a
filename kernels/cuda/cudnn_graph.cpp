// BackendDesc and ConvStatsGraph (see cudnn_graph.h). The graph: a forward convolution into
// y, and a GenStats operation on y (mode SUM_SQSUM, fp32). Engines come from cuDNN's
// heuristics (mode A, then the fallback list); the first whose execution plan finalizes is
// kept.
#include "kernels/cuda/cudnn_graph.h"

#include "kernels/cuda/cuda_util.h"

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

enum Uid : int64_t { kX = 1, kW, kY, kSum, kSqSum, kScale, kBias, kScaled, kBiased, kActivated };

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

// A pointwise operator computed in fp32 (plain ReLU: no clip, no slope set).
BackendDesc pointwise(cudnnPointwiseMode_t mode) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  BackendDesc d(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  d.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
      .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  CUDNN_CHECK(d.finalize());
  return d;
}

bool not_supported(cudnnStatus_t st) {
  return CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_NOT_SUPPORTED;
}

}  // namespace

ConvStatsGraph::ConvStatsGraph(cudnnHandle_t handle, const ConvShape& sh, bool bn_relu_prologue)
    : handle_(handle), prologue_(bn_relu_prologue) {
  // The prologue's intermediates in fp32 (cuDNN's older samples), else in the 16-bit type
  // (its documentation for some engines, and its newer samples): whichever cuDNN takes.
  plan(sh, CUDNN_DATA_FLOAT);
  if (!accepted_ && prologue_ && sh.dtype != DType::f32) {
    const std::string first = refusal_;
    refusal_.clear();
    tried_ = 0;
    plan(sh, graph_dtype(sh.dtype));
    if (accepted_) intermediates_ = dtype_name(sh.dtype);
    else refusal_ = str("fp32 intermediates: ", first, "; ", dtype_name(sh.dtype), " intermediates: ", refusal_);
  }
}

void ConvStatsGraph::plan(const ConvShape& sh, cudnnDataType_t inter) {
  const cudnnDataType_t dt = graph_dtype(sh.dtype), f32 = CUDNN_DATA_FLOAT;
  BackendDesc x = nhwc_tensor(kX, dt, sh.n, sh.c, sh.h, sh.w);
  // The prologue: relu(x * scale + bias) per input channel, inside the kernel, feeds the
  // convolution (the previous batch norm applied as the convolution reads its input). Every
  // descriptor an operation refers to is kept until the plan is made (`keep`), as cuDNN's
  // frontend keeps them.
  std::vector<BackendDesc> prologue, keep;
  BackendDesc conv_in;
  if (prologue_) {
    BackendDesc scale = nhwc_tensor(kScale, dt, 1, sh.c, 1, 1);
    BackendDesc bias = nhwc_tensor(kBias, dt, 1, sh.c, 1, 1);
    BackendDesc scaled = nhwc_tensor(kScaled, inter, sh.n, sh.c, sh.h, sh.w, true);
    BackendDesc biased = nhwc_tensor(kBiased, inter, sh.n, sh.c, sh.h, sh.w, true);
    BackendDesc act = nhwc_tensor(kActivated, inter, sh.n, sh.c, sh.h, sh.w, true);
    BackendDesc mul = pointwise(CUDNN_POINTWISE_MUL), add = pointwise(CUDNN_POINTWISE_ADD),
                relu = pointwise(CUDNN_POINTWISE_RELU_FWD);
    auto op = [&](const BackendDesc& pw, const BackendDesc& in, const BackendDesc* b,
                  const BackendDesc& out, const char* what) {
      BackendDesc o(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
      o.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
          .set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, in)
          .set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, out);
      if (b) o.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
      if (!finalized(o, what)) return false;
      prologue.push_back(std::move(o));
      return true;
    };
    const bool ok = op(mul, x, &scale, scaled, "prologue scale") &&
                    op(add, scaled, &bias, biased, "prologue bias") &&
                    op(relu, biased, nullptr, act, "prologue ReLU");
    conv_in = std::move(act);
    for (BackendDesc* d : {&scale, &bias, &scaled, &biased, &mul, &add, &relu}) keep.push_back(std::move(*d));
    if (!ok) return;
  }
  BackendDesc w = nhwc_tensor(kW, dt, sh.k, sh.c, sh.r, sh.s);
  BackendDesc y = nhwc_tensor(kY, dt, sh.n, sh.k, sh.p(), sh.q());
  BackendDesc sum = nhwc_tensor(kSum, f32, 1, sh.k, 1, 1);
  BackendDesc sqsum = nhwc_tensor(kSqSum, f32, 1, sh.k, 1, 1);

  BackendDesc conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const int64_t pads[2] = {sh.pad, sh.pad}, strides[2] = {sh.stride, sh.stride}, dil[2] = {1, 1};
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  conv.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, int64_t(2))
      .set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
      .set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pads)
      .set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pads)
      .set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, strides)
      .set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil);
  if (!finalized(conv, "convolution descriptor")) return;

  const float alpha = 1.f, beta = 0.f;
  BackendDesc fprop(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
  fprop.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, prologue_ ? conv_in : x)
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w)
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y)
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv)
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha)
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
  if (!finalized(fprop, "convolution forward")) return;

  const cudnnGenStatsMode_t gmode = CUDNN_GENSTATS_SUM_SQSUM;
  BackendDesc stats(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR);
  stats.set(CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &gmode)
      .set(CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f32)
      .set(CUDNN_ATTR_OPERATION_GENSTATS_XDESC, y)
      .set(CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, sum)
      .set(CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, sqsum);
  if (!finalized(stats, "GenStats")) return;

  BackendDesc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const BackendDesc& o : prologue) ops.push_back(o.get());
  ops.push_back(fprop.get());
  ops.push_back(stats.get());
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops.size()), ops.data())
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
  if (cudnnStatus_t st = graph.finalize(); st != CUDNN_STATUS_SUCCESS) {
    refusal_ = "operation graph: " + status_text(st);
    return;
  }

  // Engines from the heuristics, best first; the first whose plan finalizes is kept.
  std::string last = "no engine proposed";
  for (cudnnBackendHeurMode_t hm : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    BackendDesc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hm);
    if (cudnnStatus_t st = heur.finalize(); st != CUDNN_STATUS_SUCCESS) {
      last = "heuristics: " + status_text(st);
      continue;
    }
    int64_t count = 0;
    if (cudnnStatus_t st = cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
        st != CUDNN_STATUS_SUCCESS || count <= 0) {
      last = st != CUDNN_STATUS_SUCCESS ? "heuristics results: " + status_text(st)
                                        : std::string("heuristics proposed no engine");
      continue;
    }
    std::vector<BackendDesc> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(cfgs.back().get());
    }
    int64_t got = 0;
    if (cudnnStatus_t st = cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data());
        st != CUDNN_STATUS_SUCCESS) {
      last = "heuristics results: " + status_text(st);
      continue;
    }
    for (int64_t i = 0; i < got; ++i) {
      ++tried_;
      BackendDesc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_)
          .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[size_t(i)]);
      if (cudnnStatus_t st = plan.finalize(); st != CUDNN_STATUS_SUCCESS) {
        last = "execution plan: " + status_text(st);
        continue;
      }
      int64_t ws = 0, n = 0;
      CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                           CUDNN_TYPE_INT64, 1, &n, &ws));
      plan_ = std::move(plan);
      config_ = std::move(cfgs[size_t(i)]);  // kept as long as the plan, as cuDNN's frontend does
      workspace_ = size_t(ws);
      accepted_ = true;
      return;
    }
  }
  refusal_ = str(last, " (", tried_, " engines tried)");
}

// cuDNN's verdict on one descriptor of the graph: a refusal (NOT_SUPPORTED, e.g. a dtype no
// engine family takes) is kept as the graph's answer; anything else is an error.
bool ConvStatsGraph::finalized(BackendDesc& d, const char* what) {
  const cudnnStatus_t st = d.finalize();
  if (st == CUDNN_STATUS_SUCCESS) return true;
  if (!not_supported(st)) CUDNN_CHECK(st);
  refusal_ = str(what, ": ", status_text(st));
  return false;
}

void ConvStatsGraph::run(const void* x, const void* w, void* y, float* sum, float* sqsum,
                         void* workspace, const void* scale, const void* bias) const {
  SPOTRAIN_CHECK(accepted_, "internal: running a conv + statistics graph cuDNN refused: ", refusal_);
  for (const void* p : {x, w, static_cast<const void*>(y), static_cast<const void*>(sum),
                        static_cast<const void*>(sqsum)})
    SPOTRAIN_CHECK((reinterpret_cast<uintptr_t>(p) & 15) == 0,
                   "internal: the conv + statistics graph needs 16-byte aligned buffers");
  SPOTRAIN_CHECK(!prologue_ || (scale && bias), "internal: the prologue needs a scale and a bias");
  std::vector<void*> ptrs = {const_cast<void*>(x), const_cast<void*>(w), y, sum, sqsum};
  std::vector<int64_t> uids = {kX, kW, kY, kSum, kSqSum};
  if (prologue_) {
    SPOTRAIN_CHECK((reinterpret_cast<uintptr_t>(scale) & 15) == 0 && (reinterpret_cast<uintptr_t>(bias) & 15) == 0,
                   "internal: the prologue's scale and bias must be 16-byte aligned");
    ptrs.push_back(const_cast<void*>(scale));
    ptrs.push_back(const_cast<void*>(bias));
    uids.push_back(kScale);
    uids.push_back(kBias);
  }
  BackendDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(ptrs.size()), ptrs.data())
      .set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  CUDNN_CHECK(pack.finalize());
  CUDNN_CHECK(cudnnBackendExecute(handle_, plan_.get(), pack.get()));
}

}  // namespace spotrain::cuda
