// Shared plumbing of the CPU backend: the oneDNN engine and stream, memory descriptors for
// our tensors, the blocked-activation allocator, DNNL_CHECK, and the primitive descriptors
// made the way oneDNN 2.x (Debian's) or 3.x wants them. Internal to kernels/cpu/.
#pragma once
#include <oneapi/dnnl/dnnl.hpp>

#include <string>
#include <unordered_map>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cpu/blocked.h"

#define DNNL_CHECK(...)                                                         \
  do {                                                                          \
    try {                                                                       \
      __VA_ARGS__;                                                              \
    } catch (const dnnl::error& e) {                                            \
      SPOTRAIN_THROW("oneDNN call failed: ", #__VA_ARGS__, " at ", __FILE__, ":",      \
                     __LINE__, ": ", e.what(), " (status ", int(e.status), ")"); \
    }                                                                           \
  } while (0)

// A primitive's execution on the backend's stream (ctx_), finished before it returns: a
// oneDNN built on SYCL (PyPI's 3.x) queues it; one built on OpenMP (Debian's) has already run it.
#define DNNL_EXEC(...) DNNL_CHECK(__VA_ARGS__; ctx_.strm.wait())

namespace spotrain::cpu {

using dnnl::memory;
using tag = dnnl::memory::format_tag;

// oneDNN's CPU engine. A oneDNN built on SYCL (PyPI's) finds the processor through Intel's
// OpenCL runtime installed beside it, which this names to the OpenCL loader when nothing has.
dnnl::engine make_cpu_engine();

struct DnnlContext {
  dnnl::engine eng = make_cpu_engine();
  dnnl::stream strm{eng};
};

inline memory::dims dims_of(const Tensor& t) {
  return memory::dims(t.shape().begin(), t.shape().end());
}

inline memory::data_type dnnl_dtype(DType d) {
  switch (d) {
    case DType::f32: return memory::data_type::f32;
    case DType::bf16: return memory::data_type::bf16;
    case DType::f16: return memory::data_type::f16;
    case DType::u8: return memory::data_type::u8;
    case DType::i32: return memory::data_type::s32;
  }
  return memory::data_type::f32;
}

// Whether oneDNN cannot compute dtype `dt` on this processor, so that an op on it runs in
// fp32 on converted operands, its result converted back: fp16 always (this backend stores
// fp16 and computes in fp32), bf16 without AVX-512 (blocked.h).
inline bool via_f32(DType dt) { return dt == DType::f16 || (dt == DType::bf16 && !cpu_avx512()); }

// oneDNN's tag of Layout::blocked on this processor (blocked.h).
inline memory::format_tag blocked_tag() {
  return cpu_block_channels() == 16 ? memory::format_tag::nChw16c : memory::format_tag::nChw8c;
}

// The descriptor describing how `t` lies in memory.
inline memory::desc md_of(const Tensor& t) {
  auto dt = dnnl_dtype(t.dtype());
  auto dims = dims_of(t);
  if (t.ndim() == 4) {
    switch (t.layout()) {
      case Layout::nhwc: return memory::desc(dims, dt, tag::nhwc);
      case Layout::blocked: return memory::desc(dims, dt, blocked_tag());
      case Layout::plain: return memory::desc(dims, dt, tag::nchw);
    }
  }
  if (t.ndim() == 2) return memory::desc(dims, dt, tag::ab);
  if (t.ndim() == 1) return memory::desc(dims, dt, tag::a);
  SPOTRAIN_THROW("no oneDNN descriptor for tensor ", t.describe());
}

// A descriptor's dimensions and data type (renamed in oneDNN 3).
inline memory::dims dims_of(const memory::desc& md) {
#if DNNL_VERSION_MAJOR >= 3
  return md.get_dims();
#else
  return md.dims();
#endif
}
inline memory::data_type dtype_of(const memory::desc& md) {
#if DNNL_VERSION_MAJOR >= 3
  return md.get_data_type();
#else
  return md.data_type();
#endif
}

// The primitive descriptors the backend makes, for either oneDNN: 2.x takes an op descriptor
// first, 3.x takes the engine and the op's arguments at once. Direct convolutions with
// symmetric padding, batch norm with given flags, max pooling without dilation.
using ConvFwdPd = dnnl::convolution_forward::primitive_desc;
using ConvBwdDataPd = dnnl::convolution_backward_data::primitive_desc;
using ConvBwdWeightsPd = dnnl::convolution_backward_weights::primitive_desc;
using BnFwdPd = dnnl::batch_normalization_forward::primitive_desc;
using BnBwdPd = dnnl::batch_normalization_backward::primitive_desc;
using PoolFwdPd = dnnl::pooling_forward::primitive_desc;
using PoolBwdPd = dnnl::pooling_backward::primitive_desc;

inline ConvFwdPd conv_fwd_pd(const dnnl::engine& eng, const memory::desc& src,
                             const memory::desc& w, const memory::desc& dst,
                             const memory::dims& strides, const memory::dims& pad) {
  const auto prop = dnnl::prop_kind::forward_training;
  const auto alg = dnnl::algorithm::convolution_direct;
#if DNNL_VERSION_MAJOR >= 3
  return ConvFwdPd(eng, prop, alg, src, w, dst, strides, pad, pad);
#else
  return ConvFwdPd(dnnl::convolution_forward::desc(prop, alg, src, w, dst, strides, pad, pad), eng);
#endif
}

inline ConvBwdDataPd conv_bwd_data_pd(const dnnl::engine& eng, const memory::desc& dsrc,
                                      const memory::desc& w, const memory::desc& ddst,
                                      const memory::dims& strides, const memory::dims& pad,
                                      const ConvFwdPd& hint) {
  const auto alg = dnnl::algorithm::convolution_direct;
#if DNNL_VERSION_MAJOR >= 3
  return ConvBwdDataPd(eng, alg, dsrc, w, ddst, strides, pad, pad, hint);
#else
  return ConvBwdDataPd(
      dnnl::convolution_backward_data::desc(alg, dsrc, w, ddst, strides, pad, pad), eng, hint);
#endif
}

inline ConvBwdWeightsPd conv_bwd_weights_pd(const dnnl::engine& eng, const memory::desc& src,
                                            const memory::desc& dw, const memory::desc& ddst,
                                            const memory::dims& strides, const memory::dims& pad,
                                            const ConvFwdPd& hint) {
  const auto alg = dnnl::algorithm::convolution_direct;
#if DNNL_VERSION_MAJOR >= 3
  return ConvBwdWeightsPd(eng, alg, src, dw, ddst, strides, pad, pad, hint);
#else
  return ConvBwdWeightsPd(
      dnnl::convolution_backward_weights::desc(alg, src, dw, ddst, strides, pad, pad), eng, hint);
#endif
}

// Batch norm forward with output in the input's format.
inline BnFwdPd bn_fwd_pd(const dnnl::engine& eng, dnnl::prop_kind prop, const memory::desc& x,
                         float eps, dnnl::normalization_flags flags) {
#if DNNL_VERSION_MAJOR >= 3
  return BnFwdPd(eng, prop, x, x, eps, flags);
#else
  return BnFwdPd(dnnl::batch_normalization_forward::desc(prop, x, eps, flags), eng);
#endif
}

// Batch norm backward: gradients in `diff`'s format, the input in `x`'s.
inline BnBwdPd bn_bwd_pd(const dnnl::engine& eng, const memory::desc& diff, const memory::desc& x,
                         float eps, dnnl::normalization_flags flags, const BnFwdPd& hint) {
  const auto prop = dnnl::prop_kind::backward;
#if DNNL_VERSION_MAJOR >= 3
  return BnBwdPd(eng, prop, diff, diff, x, eps, flags, hint);
#else
  return BnBwdPd(dnnl::batch_normalization_backward::desc(prop, diff, x, eps, flags), eng, hint);
#endif
}

inline PoolFwdPd maxpool_fwd_pd(const dnnl::engine& eng, const memory::desc& src,
                                const memory::desc& dst, const memory::dims& strides,
                                const memory::dims& kernel, const memory::dims& pad) {
  const auto prop = dnnl::prop_kind::forward_training;
  const auto alg = dnnl::algorithm::pooling_max;
#if DNNL_VERSION_MAJOR >= 3
  return PoolFwdPd(eng, prop, alg, src, dst, strides, kernel, memory::dims(strides.size(), 0), pad,
                   pad);
#else
  return PoolFwdPd(dnnl::pooling_forward::desc(prop, alg, src, dst, strides, kernel, pad, pad), eng);
#endif
}

inline PoolBwdPd maxpool_bwd_pd(const dnnl::engine& eng, const memory::desc& dsrc,
                                const memory::desc& ddst, const memory::dims& strides,
                                const memory::dims& kernel, const memory::dims& pad,
                                const PoolFwdPd& hint) {
  const auto alg = dnnl::algorithm::pooling_max;
#if DNNL_VERSION_MAJOR >= 3
  return PoolBwdPd(eng, alg, dsrc, ddst, strides, kernel, memory::dims(strides.size(), 0), pad, pad,
                   hint);
#else
  return PoolBwdPd(dnnl::pooling_backward::desc(alg, dsrc, ddst, strides, kernel, pad, pad), eng,
                   hint);
#endif
}

inline memory mem_of(const DnnlContext& c, const Tensor& t) {
  return memory(md_of(t), c.eng, t.raw());
}

inline memory mem_of(const DnnlContext& c, const Tensor& t, const memory::desc& md) {
  return memory(md, c.eng, t.raw());
}

// A 4-D activation of logical shape (N, C, H, W) in the blocked layout, channels padded.
inline Tensor alloc_blocked(Allocator& a, const Shape& nchw, DType dt = DType::f32) {
  memory::desc md(memory::dims(nchw.begin(), nchw.end()), dnnl_dtype(dt), blocked_tag());
  return Tensor(nchw, dt, a, Layout::blocked, int64_t(md.get_size() / dtype_size(dt)));
}

// A tensor whose memory follows an arbitrary oneDNN descriptor (weights copies, workspaces).
inline Tensor alloc_for(Allocator& a, const memory::desc& md) {
  int64_t n = int64_t((md.get_size() + 3) / 4);
  return Tensor({n}, DType::f32, a);
}

inline std::string key_of(const Tensor& t) {
  std::string k = std::to_string(int(t.layout())) + ":" + std::to_string(int(t.dtype()));
  for (auto d : t.shape()) k += "," + std::to_string(d);
  return k;
}

}  // namespace spotrain::cpu
