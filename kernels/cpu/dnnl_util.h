// Shared plumbing of the CPU backend: the oneDNN engine and stream, memory descriptors for
// our tensors, the blocked-activation allocator and DNNL_CHECK. Internal to kernels/cpu/.
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

namespace spotrain::cpu {

using dnnl::memory;
using tag = dnnl::memory::format_tag;

struct DnnlContext {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
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
