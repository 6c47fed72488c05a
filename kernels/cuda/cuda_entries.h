// Cached cuDNN descriptors and algorithm choices of the CUDA backend, one entry per op and
// shape. Internal to kernels/cuda/ (the constructor, destructor and ops need them complete).
#pragma once
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_util.h"

namespace spotrain::cuda {

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
  ~ConvEntry() {
    if (x) CUDNN_WARN(cudnnDestroyTensorDescriptor(x));
    if (y) CUDNN_WARN(cudnnDestroyTensorDescriptor(y));
    if (w) CUDNN_WARN(cudnnDestroyFilterDescriptor(w));
    if (conv) CUDNN_WARN(cudnnDestroyConvolutionDescriptor(conv));
  }
};

struct CudaBackend::BnEntry {
  cudnnTensorDescriptor_t x = nullptr, stats = nullptr;
  cudnnActivationDescriptor_t act = nullptr;
  int cfg[2] = {-1, -1};  // chosen config without / with ReLU
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
