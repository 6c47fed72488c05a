// Cached oneDNN primitives of the CPU backend, one entry per op and shape. Internal to
// kernels/cpu/ (the backend's destructor and each op's translation unit need them complete).
#pragma once
#include "kernels/cpu/cpu_backend.h"

namespace spotrain::cpu {

using namespace dnnl;

struct CpuBackend::ConvEntry {
  convolution_forward::primitive_desc fwd_pd;
  convolution_forward fwd;
  convolution_backward_data::primitive_desc bd_pd;
  convolution_backward_data bd;
  bool have_bd = false;
  convolution_backward_weights::primitive_desc bw_pd;
  convolution_backward_weights bw;
  bool have_bw = false;
  memory::desc src_any, w_any, dw_any, dst_md;  // dw_any: fp32 weight gradients
  memory::dims strides, pad;
};

struct CpuBackend::BnEntry {
  batch_normalization_forward::primitive_desc fwd_pd;
  batch_normalization_forward fwd;
  batch_normalization_backward::primitive_desc bwd_pd;
  batch_normalization_backward bwd;
  bool have_bwd = false;
  batch_normalization_forward::primitive_desc inf_pd;
  batch_normalization_forward inf;
  bool have_inf = false;
};

struct CpuBackend::PoolEntry {
  pooling_forward::primitive_desc fwd_pd;
  pooling_forward fwd;
  pooling_backward::primitive_desc bwd_pd;
  pooling_backward bwd;
  bool have_bwd = false;
};

}  // namespace spotrain::cpu
