// CPU backend: set-up, data movement, elementwise ops, global pooling, linear, loss and the
// SGD update as OpenMP loops (the arithmetic itself lives in kernels/elementwise.h).
#include "kernels/cpu/cpu_entries.h"

#include <immintrin.h>
#include <sched.h>

#include <cstdlib>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <dlfcn.h>
#include <unistd.h>

#include <thread>

#include "core/environment.h"
#include "kernels/cpu/bf16_avx512.h"
#include "kernels/elementwise.h"

namespace spotrain {

bool cpu_avx512() {
  static const bool yes = [] {
    const unsigned isa = unsigned(dnnl_get_effective_cpu_isa());
    const unsigned avx512 = unsigned(dnnl_cpu_isa_avx512_core);
    return (isa & avx512) == avx512;
  }();
  return yes;
}

bool cpu_amx_bf16() {
  static const bool yes = [] {
    const unsigned isa = unsigned(dnnl_get_effective_cpu_isa());
    const unsigned amx = unsigned(dnnl_cpu_isa_avx512_core_amx);
    return (isa & amx) == amx;
  }();
  return yes;
}

// oneDNN's AMX convolutions (brgemm) take NHWC only: on the blocked layout bf16 runs its
// AVX-512 kernels at 0.4x the speed (ResNet-50, docs/PERFORMANCE.md); fp32 and every other
// processor keep the blocked layout, the faster there. SPOTRAIN_CPU_LAYOUT=blocked|nhwc
// overrides it (to compare).
Layout preferred_cpu_activations(DType compute) {
  if (const std::string& v = test_hooks().cpu_layout; !v.empty()) {
    SPOTRAIN_CHECK(v == "blocked" || v == "nhwc", "SPOTRAIN_CPU_LAYOUT must be blocked or nhwc, not '", v, "'");
    return v == "nhwc" ? Layout::nhwc : Layout::blocked;
  }
  return compute == DType::bf16 && cpu_amx_bf16() ? Layout::nhwc : Layout::blocked;
}

}  // namespace spotrain

namespace spotrain::cpu {

dnnl::engine make_cpu_engine() {
#if defined(DNNL_RUNTIME_SYCL) && DNNL_CPU_RUNTIME == DNNL_RUNTIME_SYCL
  Dl_info info;
  if (!std::getenv("OCL_ICD_FILENAMES") && dladdr(reinterpret_cast<void*>(&dnnl_version), &info) &&
      info.dli_fname) {
    std::string icd = info.dli_fname;
    icd = icd.substr(0, icd.find_last_of('/') + 1) + "libintelocl.so";
    if (access(icd.c_str(), R_OK) == 0) setenv("OCL_ICD_FILENAMES", icd.c_str(), 0);
  }
#endif
  return dnnl::engine(dnnl::engine::kind::cpu, 0);
}

using namespace dnnl;

CpuBackend::CpuBackend(const BackendOptions& opt) : act_(opt.cpu_activations) {
  SPOTRAIN_CHECK(act_ == Layout::blocked || act_ == Layout::nhwc,
                 "the CPU backend keeps activations blocked or NHWC, not ", int(act_));
  // --threads 0: OMP_NUM_THREADS if set, else the CPUs this process may run on (respects
  // taskset, cgroups cpusets and Slurm bindings, unlike the machine's core count).
  threads_ = opt.threads;
  if (threads_ <= 0) {
    if (const char* e = std::getenv("OMP_NUM_THREADS")) threads_ = std::atoi(e);
  }
  if (threads_ <= 0) {
    cpu_set_t set;
    threads_ = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                           : int(std::thread::hardware_concurrency());
  }
  threads_ = std::max(1, threads_);
  omp_set_num_threads(threads_);
  remake_bn_relu_ = !test_hooks().keep_bn_relu_outputs;
}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::name() const {
  auto v = dnnl::version();
  return str("cpu (oneDNN ", v->major, ".", v->minor, ".", v->patch, ", ", threads_, " threads)");
}

std::string CpuBackend::precision_note(DType compute, bool tf32) const {
  if (tf32) return "tf32 is a GPU math mode; on the CPU it computes in fp32";
  if (compute == DType::f16)
    return "fp16 on the CPU stores fp16 and computes in fp32 (slow; for checking loss scaling). "
           "bf16 is the fast CPU choice.";
  if (compute == DType::bf16 && via_f32(compute))
    return "this processor has no AVX-512, where oneDNN computes bf16: bf16 stores bf16 and "
           "computes in fp32 (slower than fp32 here)";
  return "";
}

// ---- data movement ------------------------------------------------------------------------

Tensor CpuBackend::upload_images_impl(const Tensor& host_nhwc, DType compute) {
  SPOTRAIN_CHECK(host_nhwc.ndim() == 4 && host_nhwc.layout() == Layout::nhwc &&
                     host_nhwc.dtype() == DType::f32,
                 "upload_images expects an fp32 NHWC batch, got ", host_nhwc.describe());
  // The first convolution reads NHWC directly: no copy in fp32.
  return compute == DType::f32 ? host_nhwc : cast(host_nhwc, compute);
}

namespace {
template <typename In, typename Out>
void convert(const void* src, void* dst, int64_t n, float (*ld)(In), Out (*st)(float)) {
  const In* a = static_cast<const In*>(src);
  Out* b = static_cast<Out*>(dst);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) b[i] = st(ld(a[i]));
}
// F16C converts 8 values per instruction with the same round-to-nearest-even (and exact
// subnormal handling) as float_to_half / half_to_float, so results do not depend on it.
__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* a, uint16_t* b, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n / 8; ++i) {
    __m256 v = _mm256_loadu_ps(a + 8 * i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b + 8 * i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  for (int64_t i = n / 8 * 8; i < n; ++i) b[i] = float_to_half(a[i]);
}
__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const uint16_t* a, float* b, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n / 8; ++i) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 8 * i));
    _mm256_storeu_ps(b + 8 * i, _mm256_cvtph_ps(v));
  }
  for (int64_t i = n / 8 * 8; i < n; ++i) b[i] = half_to_float(a[i]);
}
bool have_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c");
  return yes;
}
float ld_f32(float v) { return v; }
float st_f32(float v) { return v; }
float ld_bf16(uint16_t v) { return bf16_to_float(v); }
float ld_f16(uint16_t v) { return half_to_float(v); }
}  // namespace

Tensor CpuBackend::cast_impl(const Tensor& t, DType to) {
  DType from = t.dtype();
  SPOTRAIN_CHECK((from == DType::f32 || from == DType::bf16 || from == DType::f16) &&
                     (to == DType::f32 || to == DType::bf16 || to == DType::f16),
                 "cast: unsupported conversion ", dtype_name(from), " -> ", dtype_name(to));
  Tensor out(t.shape(), to, allocator(), t.layout(), t.storage_elems());
  int64_t n = t.storage_elems();
  if (from == to) {
    std::memcpy(out.raw(), t.raw(), t.nbytes());
  } else if (from == DType::f32 && to == DType::f16 && have_f16c()) {
    f32_to_f16_f16c(t.data<float>(), out.data<uint16_t>(), n);
  } else if (from == DType::f16 && to == DType::f32 && have_f16c()) {
    f16_to_f32_f16c(t.data<uint16_t>(), out.data<float>(), n);
  } else if (from == DType::f32) {
    if (to == DType::bf16) convert<float, uint16_t>(t.raw(), out.raw(), n, ld_f32, float_to_bf16);
    else convert<float, uint16_t>(t.raw(), out.raw(), n, ld_f32, float_to_half);
  } else {
    float (*ld)(uint16_t) = from == DType::bf16 ? ld_bf16 : ld_f16;
    if (to == DType::f32) convert<uint16_t, float>(t.raw(), out.raw(), n, ld, st_f32);
    else if (to == DType::bf16) convert<uint16_t, uint16_t>(t.raw(), out.raw(), n, ld, float_to_bf16);
    else convert<uint16_t, uint16_t>(t.raw(), out.raw(), n, ld, float_to_half);
  }
  return out;
}

Tensor CpuBackend::alloc_act(const Shape& nchw, DType dt) {
  if (act_ == Layout::blocked) return alloc_blocked(allocator(), nchw, dt);
  return Tensor(nchw, dt, allocator(), Layout::nhwc);
}

Tensor CpuBackend::upload_activation(const Tensor& host_nhwc, DType compute) {
  SPOTRAIN_CHECK(host_nhwc.ndim() == 4 && host_nhwc.layout() == Layout::nhwc &&
                     host_nhwc.dtype() == DType::f32,
                 "upload_activation expects an fp32 NHWC tensor, got ", host_nhwc.describe());
  Tensor x = from_host(host_nhwc);  // a copy: the caller's tensor stays its own
  if (act_ == Layout::blocked) {   // reordered in fp32 (oneDNN 2.6 has no fp16 reorders here)
    Tensor b = alloc_blocked(allocator(), x.shape(), DType::f32);
    memory src = mem_of(ctx_, x), dst = mem_of(ctx_, b);
    DNNL_EXEC(reorder(src, dst).execute(ctx_.strm, src, dst));
    x = b;
  }
  return compute == DType::f32 ? x : cast(x, compute);
}

Tensor CpuBackend::alloc_like(const Tensor& x, DType dt) {
  if (x.layout() == Layout::blocked) return alloc_blocked(allocator(), x.shape(), dt);
  return Tensor(x.shape(), dt, allocator(), x.layout());
}

Tensor CpuBackend::to_host(const Tensor& t0) {
  Tensor t = t0.dtype() == DType::f32 ? t0 : cast(t0, DType::f32);
  Tensor out(t.shape(), DType::f32, Allocator::host(), Layout::plain);
  if (t.ndim() == 4 && t.layout() != Layout::plain) {
    memory src = mem_of(ctx_, t), dst = mem_of(ctx_, out);
    DNNL_EXEC(reorder(src, dst).execute(ctx_.strm, src, dst));
  } else {
    SPOTRAIN_CHECK(t.dtype() == DType::f32, "to_host: only fp32 is supported, got ", t.describe());
    std::memcpy(out.raw(), t.raw(), size_t(t.numel()) * 4);
  }
  return out;
}

void CpuBackend::copy_to_host(const Tensor& src, Tensor& host_dst) {
  SPOTRAIN_CHECK(src.dtype() == DType::f32 && src.layout() == Layout::plain &&
                     src.numel() == host_dst.numel() && host_dst.dtype() == DType::f32,
                 "copy_to_host: expected plain fp32 tensors of one size, got ", src.describe(),
                 " and ", host_dst.describe());
  std::memcpy(host_dst.raw(), src.raw(), size_t(src.numel()) * 4);
}

Tensor CpuBackend::from_host(const Tensor& t) {
  Tensor out(t.shape(), t.dtype(), allocator(), t.layout(), t.storage_elems());
  std::memcpy(out.raw(), t.raw(), t.nbytes());
  return out;
}

Tensor CpuBackend::zeros_impl(const Shape& shape) {
  Tensor t(shape, DType::f32, allocator());
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

void CpuBackend::fill_impl(Tensor& t, float value) {
  t.mark_written();
  float* p = t.data<float>();
  std::fill(p, p + t.storage_elems(), value);
}

void CpuBackend::copy_impl(const Tensor& src, Tensor& dst) {
  dst.mark_written();
  SPOTRAIN_CHECK(src.nbytes() == dst.nbytes(), "copy: size mismatch ", src.describe(), " vs ",
                 dst.describe());
  std::memcpy(dst.raw(), src.raw(), src.nbytes());
}

// ---- elementwise ----------------------------------------------------------------------------

namespace {
Tensor alloc_same(Allocator& a, const Tensor& like) {
  return Tensor(like.shape(), like.dtype(), a, like.layout(), like.storage_elems());
}
void check_same(const Tensor& a, const Tensor& b, const char* op) {
  SPOTRAIN_CHECK(a.shape() == b.shape() && a.layout() == b.layout() &&
                     a.storage_elems() == b.storage_elems(),
                 op, ": operands differ: ", a.describe(), " vs ", b.describe());
}
}  // namespace

namespace {
// Runs f(i, load) over every stored element, with load(p, i) reading fp32, bf16 or fp16
// as float; store(p, i, v) writes back in the same type.
template <typename F>
void for_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::f32:
      f([](const void* p, int64_t i) { return static_cast<const float*>(p)[i]; },
        [](void* p, int64_t i, float v) { static_cast<float*>(p)[i] = v; });
      break;
    case DType::bf16:
      f([](const void* p, int64_t i) { return bf16_to_float(static_cast<const uint16_t*>(p)[i]); },
        [](void* p, int64_t i, float v) { static_cast<uint16_t*>(p)[i] = float_to_bf16(v); });
      break;
    case DType::f16:
      f([](const void* p, int64_t i) { return half_to_float(static_cast<const uint16_t*>(p)[i]); },
        [](void* p, int64_t i, float v) { static_cast<uint16_t*>(p)[i] = float_to_half(v); });
      break;
    default:
      SPOTRAIN_THROW("elementwise op on unsupported dtype ", dtype_name(dt));
  }
}
}  // namespace

namespace {
// bf16 elementwise with AVX-512 (bf16 activations are computed by oneDNN only there): 16
// values a vector, the same results as the scalar loops below (fp32 arithmetic, round to
// nearest even, NaN quieted as float_to_bf16 does; ReLU gives 0 for NaN, as relu_fwd does).
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own undefined-vector helpers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// y = a + b, then max(y, 0) with relu (vmaxps returns its second operand for NaN and for
// zeros of either sign: relu_fwd's 0).
SPOTRAIN_AVX512 void add_bf16_avx512(const uint16_t* a, const uint16_t* b, uint16_t* y, int64_t n,
                                     bool relu) {
  const int64_t vecs = n / 16;
#pragma omp parallel for schedule(static)
  for (int64_t v = 0; v < vecs; ++v) {
    __m512 s = _mm512_add_ps(bf16x16_load(a + 16 * v), bf16x16_load(b + 16 * v));
    if (relu) s = _mm512_max_ps(s, _mm512_setzero_ps());
    bf16x16_store(y + 16 * v, s);
  }
  for (int64_t i = vecs * 16; i < n; ++i) {
    const float s = bf16_to_float(a[i]) + bf16_to_float(b[i]);
    y[i] = float_to_bf16(relu ? relu_fwd(s) : s);
  }
}
// dx = dy where y > 0, else 0, on the 16-bit words: y > 0 is a positive sign-less word up to
// +inf (0x7f80); above it lie NaNs.
SPOTRAIN_AVX512 void relu_bwd_bf16_avx512(const uint16_t* dy, const uint16_t* y,
                                                                      uint16_t* dx, int64_t n) {
  const int64_t vecs = n / 32;
#pragma omp parallel for schedule(static)
  for (int64_t v = 0; v < vecs; ++v) {
    const __m512i yv = _mm512_loadu_si512(y + 32 * v);
    const __mmask32 keep = _mm512_cmpgt_epi16_mask(yv, _mm512_setzero_si512()) &
                           _mm512_cmple_epu16_mask(yv, _mm512_set1_epi16(0x7f80));
    _mm512_storeu_si512(dx + 32 * v, _mm512_maskz_mov_epi16(keep, _mm512_loadu_si512(dy + 32 * v)));
  }
  for (int64_t i = vecs * 32; i < n; ++i)
    dx[i] = float_to_bf16(relu_bwd(bf16_to_float(dy[i]), bf16_to_float(y[i])));
}
#pragma GCC diagnostic pop
}  // namespace

Tensor CpuBackend::relu_forward_impl(const Tensor& x) {
  Tensor y = alloc_same(allocator(), x);
  int64_t n = x.storage_elems();
  const void* px = x.raw();
  void* py = y.raw();
  for_dtype(x.dtype(), [&](auto ld, auto st) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) st(py, i, relu_fwd(ld(px, i)));
  });
  return y;
}

Tensor CpuBackend::relu_backward_impl(const Tensor& dy, const Tensor& y) {
  check_same(dy, y, "relu_backward");
  Tensor dx = alloc_same(allocator(), y);
  const void* g = dy.raw();
  const void* py = y.raw();
  void* d = dx.raw();
  int64_t n = y.storage_elems();
  if (y.dtype() == DType::f32) {  // the common case, kept simple enough to vectorize
    const float* fg = dy.data<float>();
    const float* fy = y.data<float>();
    float* fd = dx.data<float>();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) fd[i] = relu_bwd(fg[i], fy[i]);
    return dx;
  }
  if (y.dtype() == DType::bf16 && have_avx512bw()) {
    relu_bwd_bf16_avx512(dy.data<uint16_t>(), y.data<uint16_t>(), dx.data<uint16_t>(), n);
    return dx;
  }
  for_dtype(y.dtype(), [&](auto ld, auto st) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) st(d, i, relu_bwd(ld(g, i), ld(py, i)));
  });
  return dx;
}

Tensor CpuBackend::add_forward_impl(const Tensor& a, const Tensor& b, bool relu) {
  check_same(a, b, "add");
  Tensor y = alloc_same(allocator(), a);
  const void* pa = a.raw();
  const void* pb = b.raw();
  void* py = y.raw();
  int64_t n = a.storage_elems();
  if (a.dtype() == DType::f32) {  // the common case, kept simple enough to vectorize
    const float* fa = a.data<float>();
    const float* fb = b.data<float>();
    float* fy = y.data<float>();
    if (relu) {
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) fy[i] = relu_fwd(fa[i] + fb[i]);
    } else {
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) fy[i] = fa[i] + fb[i];
    }
    return y;
  }
  if (a.dtype() == DType::bf16 && have_avx512bw()) {
    add_bf16_avx512(a.data<uint16_t>(), b.data<uint16_t>(), y.data<uint16_t>(), n, relu);
    return y;
  }
  for_dtype(a.dtype(), [&](auto ld, auto st) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float v = ld(pa, i) + ld(pb, i);
      st(py, i, relu ? relu_fwd(v) : v);
    }
  });
  return y;
}

// acc += t over every stored element (same shape, layout and dtype).
void CpuBackend::add_into(Tensor& acc, const Tensor& t) {
  check_same(acc, t, "add");
  const int64_t n = acc.storage_elems();
  if (acc.dtype() == DType::f32) {
    float* fa = acc.data<float>();
    const float* ft = t.data<float>();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) fa[i] += ft[i];
  } else if (acc.dtype() == DType::bf16 && have_avx512bw()) {
    add_bf16_avx512(acc.data<uint16_t>(), t.data<uint16_t>(), acc.data<uint16_t>(), n, false);
  } else {
    void* pa = acc.raw();
    const void* pt = t.raw();
    for_dtype(acc.dtype(), [&](auto ld, auto st) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) st(pa, i, ld(pa, i) + ld(pt, i));
    });
  }
  acc.mark_written();
}

Tensor CpuBackend::add_backward_impl(const Tensor& dy, const Tensor& y, bool relu) {
  if (!relu) return dy;
  return relu_backward(dy, y);
}

// ---- global average pooling -------------------------------------------------------------------

namespace {
// Offset of element (n, c, hw) of a 4-D tensor with C channels and HW pixels per channel.
struct Indexer {
  Layout layout;
  int64_t c, hw, cpad, b;
  int64_t operator()(int64_t n, int64_t ci, int64_t p) const {
    switch (layout) {
      case Layout::blocked: return ((n * (cpad / b) + ci / b) * hw + p) * b + (ci % b);
      case Layout::nhwc: return (n * hw + p) * c + ci;
      case Layout::plain: return (n * c + ci) * hw + p;
    }
    return 0;
  }
};
Indexer indexer_of(const Tensor& x) {
  int64_t c = x.dim(1);
  return Indexer{x.layout(), c, x.dim(2) * x.dim(3), cpu_padded_channels(c), cpu_block_channels()};
}
}  // namespace

Tensor CpuBackend::global_avgpool_forward_impl(const Tensor& x) {
  int64_t n = x.dim(0), c = x.dim(1);
  Indexer ix = indexer_of(x);
  Tensor y({n, c}, DType::f32, allocator());
  const void* px = x.raw();
  float* py = y.data<float>();
  float inv = 1.f / float(ix.hw);
  if (x.dtype() == DType::f32 && x.layout() == Layout::blocked) {  // in memory order
    const float* f = x.data<float>();
    const int64_t b = ix.b, blocks = ix.cpad / ix.b;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < blocks; ++k) {
        float s[16] = {0.f};
        const float* base = f + (i * blocks + k) * ix.hw * b;
        for (int64_t p = 0; p < ix.hw; ++p)
#pragma omp simd
          for (int64_t j = 0; j < b; ++j) s[j] += base[p * b + j];
        for (int64_t j = 0; j < b && k * b + j < c; ++j) py[i * c + k * b + j] = s[j] * inv;
      }
    return y;
  }
  for_dtype(x.dtype(), [&](auto ld, auto) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = 0; ch < c; ++ch) {
        float s = 0.f;
        for (int64_t p = 0; p < ix.hw; ++p) s += ld(px, ix(i, ch, p));
        py[i * c + ch] = s * inv;
      }
  });
  return y;
}

Tensor CpuBackend::global_avgpool_backward_impl(const Tensor& dy, const Tensor& x) {
  int64_t n = x.dim(0), c = x.dim(1);
  Indexer ix = indexer_of(x);
  Tensor dx = alloc_same(allocator(), x);
  std::memset(dx.raw(), 0, dx.nbytes());  // padded channels stay zero
  const float* g = dy.data<float>();
  void* d = dx.raw();
  float inv = 1.f / float(ix.hw);
  if (x.dtype() == DType::f32 && x.layout() == Layout::blocked) {  // in memory order
    float* f = dx.data<float>();
    const int64_t b = ix.b, blocks = ix.cpad / ix.b;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < blocks; ++k) {
        float v[16] = {0.f};  // padded channels stay zero
        for (int64_t j = 0; j < b && k * b + j < c; ++j) v[j] = g[i * c + k * b + j] * inv;
        float* base = f + (i * blocks + k) * ix.hw * b;
        for (int64_t p = 0; p < ix.hw; ++p)
#pragma omp simd
          for (int64_t j = 0; j < b; ++j) base[p * b + j] = v[j];
      }
    return dx;
  }
  for_dtype(x.dtype(), [&](auto, auto st) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = 0; ch < c; ++ch) {
        float v = g[i * c + ch] * inv;
        for (int64_t p = 0; p < ix.hw; ++p) st(d, ix(i, ch, p), v);
      }
  });
  return dx;
}

// ---- linear ---------------------------------------------------------------------------------------

Tensor CpuBackend::linear_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b) {
  SPOTRAIN_CHECK(x.ndim() == 2 && w.ndim() == 2 && x.dim(1) == w.dim(1),
                 "linear: input ", x.describe(), " does not match weights ", w.describe());
  int64_t n = x.dim(0), k = x.dim(1), m = w.dim(0);
  Tensor y({n, m}, DType::f32, allocator());
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  const float* pb = b.data<float>();
  float* py = y.data<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      const float* xr = px + i * k;
      const float* wr = pw + j * k;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t t = 0; t < k; ++t) s += xr[t] * wr[t];
      py[i * m + j] = s + pb[j];
    }
  return y;
}

Tensor CpuBackend::linear_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw,
                                        Tensor& db, bool need_dx) {
  int64_t n = x.dim(0), k = x.dim(1), m = w.dim(0);
  const float* g = dy.data<float>();
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  float* pdw = dw.data<float>();
  float* pdb = db.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < m; ++j) {
    float* row = pdw + j * k;
    std::fill(row, row + k, 0.f);
    float sb = 0.f;
    for (int64_t i = 0; i < n; ++i) {
      float gij = g[i * m + j];
      sb += gij;
      const float* xr = px + i * k;
#pragma omp simd
      for (int64_t t = 0; t < k; ++t) row[t] += gij * xr[t];
    }
    pdb[j] = sb;
  }
  if (!need_dx) return Tensor();
  Tensor dx({n, k}, DType::f32, allocator());
  float* pdx = dx.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float* row = pdx + i * k;
    std::fill(row, row + k, 0.f);
    for (int64_t j = 0; j < m; ++j) {
      float gij = g[i * m + j];
      const float* wr = pw + j * k;
#pragma omp simd
      for (int64_t t = 0; t < k; ++t) row[t] += gij * wr[t];
    }
  }
  return dx;
}

// ---- loss -----------------------------------------------------------------------------------------

LossResult CpuBackend::softmax_xent_impl(const Tensor& logits, const int32_t* labels, float smoothing,
                                         float grad_scale, Tensor* dlogits, const LabelMix* mix) {
  SPOTRAIN_CHECK(logits.ndim() == 2, "softmax_xent: logits must be (N, classes), got ",
                 logits.describe());
  int64_t n = logits.dim(0), m = logits.dim(1);
  const float* z = logits.data<float>();
  if (dlogits && !dlogits->defined()) *dlogits = Tensor({n, m}, DType::f32, allocator());
  float* dz = dlogits ? dlogits->data<float>() : nullptr;
  double total = 0;
  int64_t top1 = 0, top5 = 0;
#pragma omp parallel for schedule(static) reduction(+ : total, top1, top5)
  for (int64_t i = 0; i < n; ++i) {
    int64_t greater = 0;
    total += softmax_xent_row(z + i * m, m, labels[i], smoothing, grad_scale / float(n),
                              dz ? dz + i * m : nullptr, &greater, mix ? mix->labels_b[i] : -1,
                              mix ? mix->lam[i] : 1.f);
    top1 += greater == 0;
    top5 += greater < 5;
  }
  return LossResult{total / double(n), top1, top5};
}

// ---- optimizer --------------------------------------------------------------------------------------

void CpuBackend::sgd_step_impl(Tensor& params, const Tensor& grads, Tensor& momentum,
                               const std::vector<SgdSegment>& segments, const SgdHyper& h) {
  if (h.skip_on_overflow && queued_overflow_) return;
  params.mark_written();
  float* p = params.data<float>();
  const float* g = grads.data<float>();
  float* m = momentum.data<float>();
  for (const auto& s : segments) {
    float wd = s.weight_decay;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = s.offset; i < s.offset + s.count; ++i)
      sgd_update(p[i], g[i], m[i], h.lr, h.momentum, wd, h.nesterov, h.grad_scale);
  }
}

// LARS: the squared norms of each adapted segment summed over fixed chunks of kLarsChunk
// elements (in parallel), then the chunks in order: the same sums whatever the thread count, so
// --deterministic runs repeat bitwise. Then each segment's update with its trust ratio.
void CpuBackend::lars_step_impl(Tensor& params, const Tensor& grads, Tensor& momentum,
                                const std::vector<LarsSegment>& segments, const LarsHyper& h) {
  if (h.skip_on_overflow && queued_overflow_) return;
  for (const auto& s : segments)
    SPOTRAIN_CHECK(s.offset >= 0 && s.count >= 0 && s.offset + s.count <= params.numel(),
                   "lars_step: segment outside the parameter buffer");
  params.mark_written();
  float* p = params.data<float>();
  const float* g = grads.data<float>();
  float* m = momentum.data<float>();
  constexpr int64_t kLarsChunk = 8192;
  struct Chunk {
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  std::vector<size_t> first(segments.size() + 1, 0);  // segment i: chunks [first[i], first[i + 1])
  for (size_t i = 0; i < segments.size(); ++i) {
    const LarsSegment& s = segments[i];
    first[i] = chunks.size();
    if (s.adapt)
      for (int64_t o = 0; o < s.count; o += kLarsChunk)
        chunks.push_back(Chunk{s.offset + o, s.offset + std::min(s.count, o + kLarsChunk)});
  }
  first[segments.size()] = chunks.size();
  std::vector<double> w_sq(chunks.size(), 0.), g_sq(chunks.size(), 0.);
  const int64_t nchunks = int64_t(chunks.size());
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < nchunks; ++c) {
    double ws = 0., gs = 0.;
    for (int64_t i = chunks[size_t(c)].begin; i < chunks[size_t(c)].end; ++i)
      lars_norm_terms(p[i], g[i], h.grad_scale, ws, gs);
    w_sq[size_t(c)] = ws;
    g_sq[size_t(c)] = gs;
  }
  for (size_t k = 0; k < segments.size(); ++k) {
    const LarsSegment& s = segments[k];
    float scaled_lr = h.lr;
    if (s.adapt) {
      double ws = 0., gs = 0.;
      for (size_t c = first[k]; c < first[k + 1]; ++c) {
        ws += w_sq[c];
        gs += g_sq[c];
      }
      scaled_lr = h.lr * lars_trust_ratio(ws, gs, h.trust, s.weight_decay, h.epsilon);
    }
    const float wd = s.weight_decay;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = s.offset; i < s.offset + s.count; ++i)
      lars_update(p[i], g[i], m[i], scaled_lr, h.momentum, wd, h.nesterov, h.grad_scale);
  }
}

void CpuBackend::lerp_impl(Tensor& dst, const Tensor& src, float weight) {
  SPOTRAIN_CHECK(dst.numel() == src.numel() && dst.dtype() == DType::f32 && src.dtype() == DType::f32,
                 "lerp: fp32 tensors of one size, got ", dst.describe(), " and ", src.describe());
  dst.mark_written();
  float* d = dst.data<float>();
  const float* s = src.data<float>();
  const int64_t n = dst.numel();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) d[i] = lerp_value(d[i], s[i], weight);
}

bool CpuBackend::unscale_and_check_impl(Tensor& grads, float inv_scale) {
  float* g = grads.data<float>();
  int64_t n = grads.numel();
  int bad = 0;
#pragma omp parallel for simd schedule(static) reduction(| : bad)
  for (int64_t i = 0; i < n; ++i) {
    float v = g[i] * inv_scale;
    g[i] = v;
    bad |= !std::isfinite(v);
  }
  return bad != 0;
}

}  // namespace spotrain::cpu
