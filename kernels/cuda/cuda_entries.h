// Cached cuDNN descriptors and algorithm choices of the CUDA backend, one entry per op and
// shape, and the small helpers the cuDNN ops share. Internal to kernels/cuda/ (the
// constructor, destructor and ops need the entries complete).
#pragma once
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/cudnn_graph.h"

#include <memory>

#include <string>

namespace spotrain::cuda {

inline cudnnDataType_t dnn_dtype(DType d) {
  switch (d) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      SPOTRAIN_THROW("cuDNN: unsupported dtype ", dtype_name(d));
  }
}

inline void check_device(const Tensor& t, const char* op) {
  SPOTRAIN_CHECK(t.defined() && t.device() == Device::cuda, op, ": expected a CUDA tensor, got ",
                 t.defined() ? t.describe() : std::string("an undefined tensor"));
}

inline void check_activation(const Tensor& x, const char* op) {
  SPOTRAIN_CHECK(
      x.defined() && x.device() == Device::cuda && x.ndim() == 4 && x.layout() == Layout::nhwc &&
          (x.dtype() == DType::f32 || x.dtype() == DType::bf16 || x.dtype() == DType::f16),
      op, ": expected an NHWC activation on the GPU, got ",
      x.defined() ? x.describe() : std::string("an undefined tensor"));
}

inline std::string key_of(const Tensor& t) {
  std::string k = dtype_name(t.dtype());
  for (auto d : t.shape()) k += "," + std::to_string(d);
  return k;
}

inline cudnnTensorDescriptor_t nhwc_desc(DType dt, int64_t n, int64_t c, int64_t h, int64_t w) {
  cudnnTensorDescriptor_t d;
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NHWC, dnn_dtype(dt), int(n), int(c),
                                         int(h), int(w)));
  return d;
}


// The fused graphs of --fusion bn per convolution shape (cudnn_graph.h, cuda_fusion.cpp): the
// convolution with its output's statistics, the same reading relu(bn(x)), the latter without
// the statistics (a block's last convolution: its batch norm makes its own), and the backward
// of a convolution reading relu(bn(x)): its weight gradient, and its data gradient through the
// ReLU and the batch norm.
enum FusionGraph : int {
  kStatsGraph, kPrologueGraph, kPrologueOnlyGraph, kWgradGraph, kDgradGraph, kFusionGraphs
};
inline const char* fusion_graph_name(int g) {
  static const char* const names[kFusionGraphs] = {"conv+stats", "bn-relu+conv+stats",
                                                   "bn-relu+conv", "bn-relu+wgrad",
                                                   "dgrad+drelu+dbn"};
  return names[g];
}

struct CudaBackend::ConvEntry {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int64_t oh = 0, ow = 0;
  bool have_fwd = false, have_bd = false, have_bw = false;
  cudnnConvolutionFwdAlgo_t fwd_algo{};
  cudnnConvolutionBwdDataAlgo_t bd_algo{};
  cudnnConvolutionBwdFilterAlgo_t bw_algo{};
  cudnnMathType_t fwd_math{}, bd_math{}, bw_math{};
  size_t fwd_ws = 0, bd_ws = 0, bw_ws = 0;
  // bf16/fp16 directions cuDNN has no algorithm for: computed in fp32 on cast operands.
  bool fwd_f32 = false, bd_f32 = false, bw_f32 = false;
  // The backward-data algorithm (chosen for beta = 0) refused to add into the gradient (beta =
  // 1): conv2d_backward_data_add computes into a new tensor and adds instead.
  bool bd_add_refused = false;
  // How each direction's algorithm was chosen (timed, the kernel cache, heuristics), for
  // --profile.
  std::string fwd_how, bd_how, bw_how;
  std::string key;  // the shape, as conv_cache_ and the kernel cache name it
  ConvShape shape;  // for the graph API
  // The conv + batch-norm fusion graphs of this shape (FusionGraph), planned at their first
  // use, and whether each ran.
  std::unique_ptr<FusedGraph> fused[kFusionGraphs];
  bool fused_ran[kFusionGraphs] = {};
  ~ConvEntry() {
    if (x) CUDNN_WARN(cudnnDestroyTensorDescriptor(x));
    if (y) CUDNN_WARN(cudnnDestroyTensorDescriptor(y));
    if (w) CUDNN_WARN(cudnnDestroyFilterDescriptor(w));
    if (conv) CUDNN_WARN(cudnnDestroyConvolutionDescriptor(conv));
  }
};

// BnSaved::backend_state slots of the CUDA batch norm: cuDNN's reserve space, its saved inverse
// standard deviation, and (with a ReLU) the forward output for the mask: the same slot as the
// composed default.
constexpr int kBnReserve = 0, kBnInvStd = 1, kBnOutput = BnSaved::kComposedOutput;

struct CudaBackend::BnEntry {
  cudnnTensorDescriptor_t x = nullptr, stats = nullptr;
  cudnnActivationDescriptor_t act = nullptr;
  int cfg[2] = {-1, -1};  // chosen config without / with ReLU
  // Backward without ReLU from statistics that came with no reserve space (conv + batch-norm
  // fusion makes them outside cuDNN): the first configuration needing none, probed apart
  // from the forward's choice.
  int cfg_bare = -1;
  // relu(bn(x) + z) through cuDNN's BN_ADD_ACTIVATION: 1 it runs, 0 cuDNN refused this shape
  // or dtype (the op is then composed of BN and Add), -1 not tried yet.
  int add_fused = -1;
  // No cuDNN configuration runs this dtype (bf16 on cuDNN builds without bf16 batch norm):
  // computed in fp32 on cast operands, the ReLU applied in the activation dtype.
  bool f32 = false;
  ~BnEntry() {
    if (x) CUDNN_WARN(cudnnDestroyTensorDescriptor(x));
    if (stats) CUDNN_WARN(cudnnDestroyTensorDescriptor(stats));
    if (act) CUDNN_WARN(cudnnDestroyActivationDescriptor(act));
  }
};

}  // namespace spotrain::cuda
