// The CUDA backend's own kernels: casts, ReLU, Add, BN inference and statistics, global
// average pooling, bias and column sums, softmax cross-entropy, the multi-tensor SGD and LARS
// updates and the overflow check. Per-element math comes from kernels/elementwise.h (shared with
// the CPU backend and covered by its tests). Simple grid-stride loops over int64 indices,
// except the large elementwise maps (ReLU, Add and their gradients), which move 16 bytes per
// load and store: scalar 2-byte accesses reached a third of the memory bandwidth on an H200.
#include <cuda_bf16.h>
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/elementwise.h"

namespace spotrain::cuda {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > 65535 * 8) b = 65535 * 8;  // grid-stride beyond this
  return unsigned(b);
}

struct F32 {
  using T = float;
  static __device__ float ld(const T* p, int64_t i) { return p[i]; }
  static __device__ void st(T* p, int64_t i, float v) { p[i] = v; }
};
struct BF16 {
  using T = uint16_t;
  static __device__ float ld(const T* p, int64_t i) { return bf16_to_float(p[i]); }
  static __device__ void st(T* p, int64_t i, float v) { p[i] = float_to_bf16(v); }
};
struct F16 {
  using T = uint16_t;
  static __device__ float ld(const T* p, int64_t i) { return half_to_float(p[i]); }
  static __device__ void st(T* p, int64_t i, float v) { p[i] = float_to_half(v); }
};

// Calls f(Tag{}) for the storage type of dt.
template <typename F>
void dispatch(DType dt, F&& f) {
  switch (dt) {
    case DType::f32:
      f(F32{});
      break;
    case DType::bf16:
      f(BF16{});
      break;
    case DType::f16:
      f(F16{});
      break;
    default:
      break;  // callers check dtypes on the host
  }
}

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// ---- vectorized elementwise maps ---------------------------------------------------------------
// Each thread handles one 16-byte vector (8 fp16/bf16 or 4 fp32 values) of every operand;
// conversions use the hardware's round-to-nearest-even, which is what elementwise.h computes
// (NaN payloads aside: the hardware gives the canonical NaN).
__device__ inline float to_f32(uint16_t v, F16) { return __half2float(__ushort_as_half(v)); }
__device__ inline float to_f32(uint16_t v, BF16) {
  return __bfloat162float(__ushort_as_bfloat16(v));
}
__device__ inline float to_f32(float v, F32) { return v; }
__device__ inline uint16_t from_f32(float v, F16) { return __half_as_ushort(__float2half_rn(v)); }
__device__ inline uint16_t from_f32(float v, BF16) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
__device__ inline float from_f32(float v, F32) { return v; }

template <typename D>
constexpr int kVec = int(16 / sizeof(typename D::T));

// out[i] = f(in0[i], in1[i]) over n / kVec<D> vectors; in1 may be null for one-input maps.
template <typename D, typename F>
__global__ void map_vec_kernel(const uint4* in0, const uint4* in1, uint4* out, int64_t nvec, F f) {
  using T = typename D::T;
  constexpr int V = kVec<D>;
  GRID_STRIDE(i, nvec) {
    uint4 a = in0[i];
    uint4 b = in1 ? in1[i] : a;
    uint4 r;
    const T* pa = reinterpret_cast<const T*>(&a);
    const T* pb = reinterpret_cast<const T*>(&b);
    T* pr = reinterpret_cast<T*>(&r);
#pragma unroll
    for (int k = 0; k < V; ++k) pr[k] = from_f32(f(to_f32(pa[k], D{}), to_f32(pb[k], D{})), D{});
    out[i] = r;
  }
}

// The same for the elements from `start` on, one at a time (a tail, or unaligned operands).
template <typename D, typename F>
__global__ void map_scalar_kernel(const typename D::T* in0, const typename D::T* in1,
                                  typename D::T* out, int64_t start, int64_t n, F f) {
  GRID_STRIDE(j, n - start) {
    int64_t i = start + j;
    out[i] = from_f32(f(to_f32(in0[i], D{}), to_f32(in1 ? in1[i] : in0[i], D{})), D{});
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Runs out = f(in0, in1) elementwise over n values of dtype dt, vectorized where it can be.
template <typename F>
void launch_map(DType dt, const void* in0, const void* in1, void* out, int64_t n, F f,
                cudaStream_t s) {
  if (n <= 0) return;
  dispatch(dt, [&](auto d) {
    using D = decltype(d);
    using T = typename D::T;
    constexpr int V = kVec<D>;
    bool vec = aligned16(in0) && aligned16(out) && (!in1 || aligned16(in1));
    int64_t nvec = vec ? n / V : 0;
    if (nvec > 0) {
      int64_t blocks = (nvec + kThreads - 1) / kThreads;
      map_vec_kernel<D><<<unsigned(std::min<int64_t>(blocks, int64_t(1) << 30)), kThreads, 0, s>>>(
          static_cast<const uint4*>(in0), static_cast<const uint4*>(in1), static_cast<uint4*>(out),
          nvec, f);
    }
    int64_t start = nvec * V;
    if (start < n)
      map_scalar_kernel<D><<<blocks_for(n - start), kThreads, 0, s>>>(
          static_cast<const T*>(in0), static_cast<const T*>(in1), static_cast<T*>(out), start, n, f);
  });
  CUDA_CHECK_LAUNCH();
}

struct ReluFwd {
  __device__ float operator()(float x, float) const { return relu_fwd(x); }
};
struct ReluBwd {
  __device__ float operator()(float dy, float y) const { return relu_bwd(dy, y); }
};
struct AddFwd {
  bool relu;
  __device__ float operator()(float a, float b) const {
    float v = a + b;
    return relu ? relu_fwd(v) : v;
  }
};

// ---- max pooling ---------------------------------------------------------------------------------
// One thread per output pixel and group of V channels (V = 8 for 16-bit types and 4 for fp32
// when the channel count allows: 16-byte loads), NHWC.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename D, int V>
__global__ void maxpool_fwd_kernel(const typename D::T* x, typename D::T* y, uint8_t* idx,
                                   PoolGeom g) {
  using T = typename D::T;
  const int cg = g.c / V;
  const int64_t total = int64_t(g.n) * g.oh * g.ow * cg;
  GRID_STRIDE(t, total) {
    const int cv = int(t % cg);
    int64_t r = t / cg;
    const int ow = int(r % g.ow);
    r /= g.ow;
    const int oh = int(r % g.oh);
    const int n = int(r / g.oh);
    float best[V];
    uint8_t at[V];
    bool first = true;  // the window's first valid position is taken as it is (even -inf)
    for (int kh = 0; kh < g.k; ++kh) {
      const int ih = oh * g.stride - g.pad + kh;
      if (ih < 0 || ih >= g.h) continue;
      for (int kw = 0; kw < g.k; ++kw) {
        const int iw = ow * g.stride - g.pad + kw;
        if (iw < 0 || iw >= g.w) continue;
        Pack<T, V> p = *reinterpret_cast<const Pack<T, V>*>(
            x + ((int64_t(n) * g.h + ih) * g.w + iw) * g.c + int64_t(cv) * V);
#pragma unroll
        for (int v = 0; v < V; ++v) {
          float val = to_f32(p.v[v], D{});
          if (first || pool_takes(val, best[v])) {
            best[v] = val;
            at[v] = uint8_t(kh * g.k + kw);
          }
        }
        first = false;
      }
    }
    const int64_t o = ((int64_t(n) * g.oh + oh) * g.ow + ow) * g.c + int64_t(cv) * V;
    Pack<T, V> out;
    Pack<uint8_t, V> ix;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      out.v[v] = from_f32(best[v], D{});
      ix.v[v] = at[v];
    }
    *reinterpret_cast<Pack<T, V>*>(y + o) = out;
    *reinterpret_cast<Pack<uint8_t, V>*>(idx + o) = ix;
  }
}

template <typename D, int V>
__global__ void maxpool_bwd_kernel(const typename D::T* dy, const uint8_t* idx, typename D::T* dx,
                                   PoolGeom g) {
  using T = typename D::T;
  const int cg = g.c / V;
  const int64_t total = int64_t(g.n) * g.h * g.w * cg;
  GRID_STRIDE(t, total) {
    const int cv = int(t % cg);
    int64_t r = t / cg;
    const int iw = int(r % g.w);
    r /= g.w;
    const int ih = int(r % g.h);
    const int n = int(r / g.h);
    float acc[V];
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = 0.f;
    int oh0, oh1, ow0, ow1;  // the windows that hold (ih, iw)
    pool_windows_holding(ih, g.k, g.stride, g.pad, g.oh, oh0, oh1);
    pool_windows_holding(iw, g.k, g.stride, g.pad, g.ow, ow0, ow1);
    for (int oh = oh0; oh <= oh1; ++oh)
      for (int ow = ow0; ow <= ow1; ++ow) {
        const uint8_t mine =
            uint8_t((ih - (oh * g.stride - g.pad)) * g.k + (iw - (ow * g.stride - g.pad)));
        const int64_t o = ((int64_t(n) * g.oh + oh) * g.ow + ow) * g.c + int64_t(cv) * V;
        Pack<uint8_t, V> ix = *reinterpret_cast<const Pack<uint8_t, V>*>(idx + o);
        Pack<T, V> d = *reinterpret_cast<const Pack<T, V>*>(dy + o);
#pragma unroll
        for (int v = 0; v < V; ++v)
          if (ix.v[v] == mine) acc[v] += to_f32(d.v[v], D{});
      }
    Pack<T, V> out;
#pragma unroll
    for (int v = 0; v < V; ++v) out.v[v] = from_f32(acc[v], D{});
    *reinterpret_cast<Pack<T, V>*>(dx + ((int64_t(n) * g.h + ih) * g.w + iw) * g.c +
                                   int64_t(cv) * V) = out;
  }
}

template <typename In, typename Out>
__global__ void cast_kernel(const typename In::T* a, typename Out::T* b, int64_t n) {
  GRID_STRIDE(i, n) Out::st(b, i, In::ld(a, i));
}

__global__ void fill_kernel(float* p, float v, int64_t n) { GRID_STRIDE(i, n) p[i] = v; }

template <typename D>
__global__ void normalize_pixels_kernel(const uint8_t* src, typename D::T* dst, int64_t n,
                                        PixelAffine a) {
  GRID_STRIDE(i, n) {
    const int c = int(i % a.channels);
    D::st(dst, i, __fmaf_rn(float(src[i]), a.scale[c], a.shift[c]));
  }
}

// out[o][r][s][c] = w[o][c][r][s]
template <typename D>
__global__ void oihw_to_ohwi_kernel(const float* w, typename D::T* out, int o, int ci, int h,
                                    int wd) {
  int64_t n = int64_t(o) * ci * h * wd;
  GRID_STRIDE(idx, n) {
    int64_t t = idx;
    int c = int(t % ci);
    t /= ci;
    int s = int(t % wd);
    t /= wd;
    int r = int(t % h);
    t /= h;
    int k = int(t);
    D::st(out, idx, w[((int64_t(k) * ci + c) * h + r) * wd + s]);
  }
}

template <typename D>
__global__ void ohwi_to_oihw_kernel(const typename D::T* in, float* out, int o, int ci, int h,
                                    int wd) {
  int64_t n = int64_t(o) * ci * h * wd;
  GRID_STRIDE(idx, n) {  // idx walks the OIHW output
    int64_t t = idx;
    int s = int(t % wd);
    t /= wd;
    int r = int(t % h);
    t /= h;
    int c = int(t % ci);
    t /= ci;
    int k = int(t);
    out[idx] = D::ld(in, ((int64_t(k) * h + r) * wd + s) * ci + c);
  }
}

template <typename D>
__global__ void bn_infer_fwd_kernel(const typename D::T* x, typename D::T* y, int64_t n, int c,
                                    const float* mean, const float* var, const float* gamma,
                                    const float* beta, float eps, bool relu) {
  GRID_STRIDE(i, n) {
    int ch = int(i % c);
    float v = bn_infer(D::ld(x, i), mean[ch], var[ch], gamma[ch], beta[ch], eps);
    D::st(y, i, relu ? relu_fwd(v) : v);
  }
}

__global__ void invstd_to_var_kernel(const float* invstd, float* var, int c, float eps) {
  GRID_STRIDE(i, c) {
    float s = invstd[i];
    float v = 1.f / (s * s) - eps;
    var[i] = v > 0.f ? v : 0.f;  // a constant channel can round to a tiny negative
  }
}

__global__ void bn_running_kernel(float* rm, float* rv, const float* mean, const float* var, int c,
                                  float momentum, double unbias) {
  GRID_STRIDE(i, c) bn_running_update(rm[i], rv[i], mean[i], var[i], momentum, unbias);
}

template <typename D>
__global__ void gap_fwd_kernel(const typename D::T* x, float* y, int64_t n, int64_t c, int64_t hw) {
  float inv = 1.f / float(hw);
  GRID_STRIDE(idx, n * c) {  // idx = i * c + ch; neighbouring threads read neighbouring channels
    int64_t i = idx / c, ch = idx % c;
    const typename D::T* base = x + i * hw * c + ch;
    float s = 0.f;
    for (int64_t p = 0; p < hw; ++p) s += D::ld(base, p * c);
    y[idx] = s * inv;
  }
}

template <typename D>
__global__ void gap_bwd_kernel(const float* dy, typename D::T* dx, int64_t n, int64_t c,
                               int64_t hw) {
  float inv = 1.f / float(hw);
  GRID_STRIDE(idx, n * hw * c) {
    int64_t ch = idx % c, i = idx / (hw * c);
    D::st(dx, idx, dy[i * c + ch] * inv);
  }
}

__global__ void bias_rows_kernel(float* y, const float* b, int64_t n, int64_t m) {
  GRID_STRIDE(idx, n * m) y[idx] = b[idx % m];
}

__global__ void col_sum_kernel(const float* dy, float* db, int64_t n, int64_t m) {
  GRID_STRIDE(j, m) {
    float s = 0.f;
    for (int64_t i = 0; i < n; ++i) s += dy[i * m + j];
    db[j] = s;
  }
}

// Softmax cross-entropy, one block per row (the arithmetic of elementwise.h's
// softmax_xent_row, with its sums taken in parallel): a row of 1,000 logits per thread took
// 0.4 ms of a ResNet-50 step.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T* smem) {
  for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();  // smem may still be read from a previous reduction
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = smem[0];
  for (int w = 1; w < warps; ++w) v = op(v, smem[w]);
  return v;
}

// labels_b / lam (mixup, cutmix; null without): as softmax_xent_row's yb and lam.
__global__ void softmax_xent_fwd_kernel(const float* z, const int32_t* labels, const int32_t* labels_b,
                                        const float* lam, int64_t m, float smoothing, float dscale,
                                        const float* dscale_dev, float* dz, double* loss,
                                        int64_t* greater) {
  __shared__ double sd[32];
  __shared__ float sf[32];
  __shared__ long long sl[32];
  const int64_t i = blockIdx.x;
  const float* zr = z + i * m;
  const int32_t y = labels[i];
  const float zy = zr[y];
  float mx = zr[0];
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) mx = zr[j] > mx ? zr[j] : mx;
  mx = block_reduce(mx, [](float a, float b) { return a > b ? a : b; }, sf);
  double se = 0, sum_z = 0;
  long long g = 0;
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
    se += ::exp(double(zr[j] - mx));
    sum_z += zr[j];
    g += ranks_above(zr[j], j, zy, y) ? 1 : 0;
  }
  auto add = [](auto a, auto b) { return a + b; };
  se = block_reduce(se, add, sd);
  sum_z = block_reduce(sum_z, add, sd);
  g = block_reduce(g, add, sl);
  const float off = smoothing / float(m), on = 1.f - smoothing + off;
  const double lse = ::log(se) + mx;
  const int32_t yb = labels_b ? labels_b[i] : -1;
  const float l = lam ? lam[i] : 1.f;
  if (threadIdx.x == 0) {
    double li = on * (lse - zy) + off * (double(m) * lse - sum_z) - off * (lse - zy);
    if (yb >= 0) {
      const double zb = zr[yb];
      li = double(l) * li + double(1.f - l) * (on * (lse - zb) + off * (double(m) * lse - sum_z) - off * (lse - zb));
    }
    loss[i] = li;
    greater[i] = g;
  }
  if (dscale_dev) dscale = *dscale_dev;
  if (dz)
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
      float p = float(::exp(double(zr[j]) - lse));
      float q = j == y ? on : off;
      if (yb >= 0) q = l * q + (1.f - l) * (j == yb ? on : off);
      dz[i * m + j] = (p - q) * dscale;
    }
}

// One block per chunk of one weight-decay segment.
__global__ void sgd_kernel(float* p, const float* g, float* m, const SgdChunk* chunks, float lr,
                           float momentum, bool nesterov, float grad_scale, const int* skip,
                           const float* lr_dev) {
  if (skip && *skip) return;
  if (lr_dev) lr = *lr_dev;
  SgdChunk ck = chunks[blockIdx.x];
  for (int j = threadIdx.x; j < ck.count; j += blockDim.x) {
    int64_t i = ck.offset + j;
    float pi = p[i], mi = m[i];
    sgd_update(pi, g[i], mi, lr, momentum, ck.weight_decay, nesterov, grad_scale);
    p[i] = pi;
    m[i] = mi;
  }
}

// LARS, first half: one block per chunk of an adapted segment, its squared norms.
__global__ void lars_norms_kernel(const float* p, const float* g, const LarsChunk* chunks,
                                  float grad_scale, const int* skip, double* partial) {
  __shared__ double sd[32];
  if (skip && *skip) return;
  const LarsChunk ck = chunks[blockIdx.x];
  if (!ck.adapt) return;  // the whole block alike
  double ws = 0, gs = 0;
  for (int j = threadIdx.x; j < ck.count; j += blockDim.x)
    lars_norm_terms(p[ck.offset + j], g[ck.offset + j], grad_scale, ws, gs);
  auto add = [](double a, double b) { return a + b; };
  ws = block_reduce(ws, add, sd);
  gs = block_reduce(gs, add, sd);
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = ws;
    partial[2 * blockIdx.x + 1] = gs;
  }
}

// LARS, second half: one block per chunk; its segment's trust ratio from the chunks' sums (in
// chunk order), then the update.
__global__ void lars_kernel(float* p, const float* g, float* m, const LarsChunk* chunks,
                            const double* partial, float lr, float momentum, bool nesterov,
                            float grad_scale, float eeta, float epsilon, const int* skip,
                            const float* lr_dev) {
  __shared__ float scaled;
  if (skip && *skip) return;
  if (lr_dev) lr = *lr_dev;
  const LarsChunk ck = chunks[blockIdx.x];
  if (threadIdx.x == 0) {
    float s = lr;
    if (ck.adapt) {
      double ws = 0, gs = 0;
      for (int c = ck.first; c < ck.first + ck.chunks; ++c) {
        ws += partial[2 * c];
        gs += partial[2 * c + 1];
      }
      s = lr * lars_trust_ratio(ws, gs, eeta, ck.weight_decay, epsilon);
    }
    scaled = s;
  }
  __syncthreads();
  const float scaled_lr = scaled;
  for (int j = threadIdx.x; j < ck.count; j += blockDim.x) {
    const int64_t i = ck.offset + j;
    float pi = p[i], mi = m[i];
    lars_update(pi, g[i], mi, scaled_lr, momentum, ck.weight_decay, nesterov, grad_scale);
    p[i] = pi;
    m[i] = mi;
  }
}

__global__ void unscale_check_kernel(float* g, int64_t n, float inv_scale, const float* inv_dev,
                                     int* flag) {
  if (inv_dev) inv_scale = *inv_dev;
  bool bad = false;
  GRID_STRIDE(i, n) {
    float v = g[i] * inv_scale;
    g[i] = v;
    bad |= !isfinite(v);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

}  // namespace

void launch_cast(const void* src, DType from, void* dst, DType to, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  dispatch(from, [&](auto in) {
    using In = decltype(in);
    dispatch(to, [&](auto out) {
      using Out = decltype(out);
      cast_kernel<In, Out><<<blocks_for(n), kThreads, 0, s>>>(
          static_cast<const typename In::T*>(src), static_cast<typename Out::T*>(dst), n);
    });
  });
  CUDA_CHECK_LAUNCH();
}

void launch_normalize_pixels(const uint8_t* src, void* dst, DType dt, int64_t n,
                             const PixelAffine& a, cudaStream_t s) {
  if (n <= 0) return;
  dispatch(dt, [&](auto d) {
    using D = decltype(d);
    normalize_pixels_kernel<D><<<blocks_for(n), kThreads, 0, s>>>(
        src, static_cast<typename D::T*>(dst), n, a);
  });
  CUDA_CHECK_LAUNCH();
}

namespace {
// Channels per thread: a 16-byte load when the channel count and the pointers allow it.
template <typename D>
int pool_vec(const PoolGeom& g, std::initializer_list<const void*> ptrs) {
  constexpr int V = kVec<D>;
  if (g.c % V != 0) return 1;
  for (const void* p : ptrs)
    if (!aligned16(p)) return 1;
  return V;
}
}  // namespace

void launch_maxpool_fwd(const void* x, void* y, uint8_t* idx, DType dt, const PoolGeom& g,
                        cudaStream_t s) {
  dispatch(dt, [&](auto d) {
    using D = decltype(d);
    using T = typename D::T;
    const int64_t outs = int64_t(g.n) * g.oh * g.ow * g.c;
    if (outs <= 0) return;
    if (pool_vec<D>(g, {x, y, idx}) > 1)
      maxpool_fwd_kernel<D, kVec<D>><<<blocks_for(outs / kVec<D>), kThreads, 0, s>>>(
          static_cast<const T*>(x), static_cast<T*>(y), idx, g);
    else
      maxpool_fwd_kernel<D, 1><<<blocks_for(outs), kThreads, 0, s>>>(static_cast<const T*>(x),
                                                                     static_cast<T*>(y), idx, g);
  });
  CUDA_CHECK_LAUNCH();
}

void launch_maxpool_bwd(const void* dy, const uint8_t* idx, void* dx, DType dt, const PoolGeom& g,
                        cudaStream_t s) {
  dispatch(dt, [&](auto d) {
    using D = decltype(d);
    using T = typename D::T;
    const int64_t ins = int64_t(g.n) * g.h * g.w * g.c;
    if (ins <= 0) return;
    if (pool_vec<D>(g, {dy, idx, dx}) > 1)
      maxpool_bwd_kernel<D, kVec<D>><<<blocks_for(ins / kVec<D>), kThreads, 0, s>>>(
          static_cast<const T*>(dy), idx, static_cast<T*>(dx), g);
    else
      maxpool_bwd_kernel<D, 1><<<blocks_for(ins), kThreads, 0, s>>>(static_cast<const T*>(dy), idx,
                                                                    static_cast<T*>(dx), g);
  });
  CUDA_CHECK_LAUNCH();
}

void launch_fill_f32(float* p, float v, int64_t n, cudaStream_t s) {
  if (n > 0) fill_kernel<<<blocks_for(n), kThreads, 0, s>>>(p, v, n);
  CUDA_CHECK_LAUNCH();
}

void launch_relu_fwd(const void* x, void* y, DType dt, int64_t n, cudaStream_t s) {
  launch_map(dt, x, nullptr, y, n, ReluFwd{}, s);
}

void launch_relu_bwd(const void* dy, const void* y, void* dx, DType dt, int64_t n, cudaStream_t s) {
  launch_map(dt, dy, y, dx, n, ReluBwd{}, s);
}

void launch_add_fwd(const void* a, const void* b, void* y, DType dt, int64_t n, bool relu,
                    cudaStream_t s) {
  launch_map(dt, a, b, y, n, AddFwd{relu}, s);
}

void launch_oihw_to_ohwi(const float* w, void* out, DType dt, int o, int i, int h, int w_,
                         cudaStream_t s) {
  int64_t n = int64_t(o) * i * h * w_;
  if (n <= 0) return;
  dispatch(dt, [&](auto d) {
    using D = decltype(d);
    oihw_to_ohwi_kernel<D>
        <<<blocks_for(n), kThreads, 0, s>>>(w, static_cast<typename D::T*>(out), o, i, h, w_);
  });
  CUDA_CHECK_LAUNCH();
}

void launch_ohwi_to_oihw(const void* in, DType dt, float* out, int o, int i, int h, int w_,
                         cudaStream_t s) {
  int64_t n = int64_t(o) * i * h * w_;
  if (n <= 0) return;
  dispatch(dt, [&](auto d) {
    using D = decltype(d);
    ohwi_to_oihw_kernel<D><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const typename D::T*>(in),
                                                              out, o, i, h, w_);
  });
  CUDA_CHECK_LAUNCH();
}

template <typename D>
__global__ void bn_bwd_apply_kernel(const typename D::T* g, const typename D::T* x,
                                    typename D::T* dx, int64_t n, int c, const float* eq_g,
                                    const float* eq_x, const float* eq_bias) {
  GRID_STRIDE(i, n) {
    int ch = int(i % c);
    D::st(dx, i, eq_g[ch] * D::ld(g, i) + eq_x[ch] * D::ld(x, i) + eq_bias[ch]);
  }
}

void launch_bn_bwd_apply(const void* g, const void* x, void* dx, DType dt, int64_t n, int c,
                         const float* eq_g, const float* eq_x, const float* eq_bias,
                         cudaStream_t s) {
  if (n <= 0) return;
  dispatch(dt, [&](auto d) {
    using D = decltype(d);
    using T = typename D::T;
    bn_bwd_apply_kernel<D><<<blocks_for(n), kThreads, 0, s>>>(
        static_cast<const T*>(g), static_cast<const T*>(x), static_cast<T*>(dx), n, c, eq_g, eq_x,
        eq_bias);
  });
  CUDA_CHECK_LAUNCH();
}

void launch_bn_infer(const void* x, void* y, DType dt, int64_t n, int c, const float* mean,
                     const float* var, const float* gamma, const float* beta, float eps, bool relu,
                     cudaStream_t s) {
  if (n <= 0) return;
  dispatch(dt, [&](auto d) {
    using D = decltype(d);
    using T = typename D::T;
    bn_infer_fwd_kernel<D><<<blocks_for(n), kThreads, 0, s>>>(
        static_cast<const T*>(x), static_cast<T*>(y), n, c, mean, var, gamma, beta, eps, relu);
  });
  CUDA_CHECK_LAUNCH();
}

__global__ void bn_stats_from_sums_kernel(const float* sum, const float* sqsum, int c,
                                          float inv_count, float eps, float* mean, float* var,
                                          float* invstd) {
  GRID_STRIDE(i, c) {
    const float m = sum[i] * inv_count;
    const float v = fmaxf(sqsum[i] * inv_count - m * m, 0.f);  // rounding can go below 0
    mean[i] = m;
    var[i] = v;
    invstd[i] = rsqrtf(v + eps);
  }
}

template <typename D>
__global__ void bn_scale_bias_kernel(const float* mean, const float* var, const float* gamma,
                                     const float* beta, int c, float eps, typename D::T* scale,
                                     typename D::T* bias) {
  GRID_STRIDE(i, c) {
    const float sc = gamma[i] * rsqrtf(var[i] + eps);
    D::st(scale, i, sc);
    D::st(bias, i, beta[i] - mean[i] * sc);
  }
}

void launch_bn_stats_from_sums(const float* sum, const float* sqsum, int c, int64_t count,
                               float eps, float* mean, float* var, float* invstd, cudaStream_t s) {
  if (c <= 0 || count <= 0) return;
  bn_stats_from_sums_kernel<<<blocks_for(c), kThreads, 0, s>>>(sum, sqsum, c, 1.f / float(count),
                                                                eps, mean, var, invstd);
  CUDA_CHECK_LAUNCH();
}

void launch_bn_scale_bias(const float* mean, const float* var, const float* gamma,
                          const float* beta, int c, float eps, void* scale, void* bias, DType dt,
                          cudaStream_t s) {
  if (c <= 0) return;
  dispatch(dt, [&](auto d) {
    using D = decltype(d);
    using T = typename D::T;
    bn_scale_bias_kernel<D><<<blocks_for(c), kThreads, 0, s>>>(
        mean, var, gamma, beta, c, eps, static_cast<T*>(scale), static_cast<T*>(bias));
  });
  CUDA_CHECK_LAUNCH();
}

void launch_invstd_to_var(const float* invstd, float* var, int c, float eps, cudaStream_t s) {
  if (c > 0) invstd_to_var_kernel<<<blocks_for(c), kThreads, 0, s>>>(invstd, var, c, eps);
  CUDA_CHECK_LAUNCH();
}

void launch_bn_running(float* rm, float* rv, const float* mean, const float* var, int c,
                       float momentum, double unbias, cudaStream_t s) {
  if (c > 0)
    bn_running_kernel<<<blocks_for(c), kThreads, 0, s>>>(rm, rv, mean, var, c, momentum, unbias);
  CUDA_CHECK_LAUNCH();
}

void launch_gap_fwd(const void* x, DType dt, float* y, int64_t n, int64_t c, int64_t hw,
                    cudaStream_t s) {
  if (n * c <= 0) return;
  dispatch(dt, [&](auto d) {
    using D = decltype(d);
    gap_fwd_kernel<D>
        <<<blocks_for(n * c), kThreads, 0, s>>>(static_cast<const typename D::T*>(x), y, n, c, hw);
  });
  CUDA_CHECK_LAUNCH();
}

void launch_gap_bwd(const float* dy, void* dx, DType dt, int64_t n, int64_t c, int64_t hw,
                    cudaStream_t s) {
  if (n * c * hw <= 0) return;
  dispatch(dt, [&](auto d) {
    using D = decltype(d);
    gap_bwd_kernel<D>
        <<<blocks_for(n * c * hw), kThreads, 0, s>>>(dy, static_cast<typename D::T*>(dx), n, c, hw);
  });
  CUDA_CHECK_LAUNCH();
}

void launch_bias_rows(float* y, const float* b, int64_t n, int64_t m, cudaStream_t s) {
  if (n * m > 0) bias_rows_kernel<<<blocks_for(n * m), kThreads, 0, s>>>(y, b, n, m);
  CUDA_CHECK_LAUNCH();
}

void launch_col_sum(const float* dy, float* db, int64_t n, int64_t m, cudaStream_t s) {
  if (m > 0) col_sum_kernel<<<blocks_for(m), kThreads, 0, s>>>(dy, db, n, m);
  CUDA_CHECK_LAUNCH();
}

void launch_softmax_xent(const float* z, const int32_t* labels, const int32_t* labels_b,
                         const float* lam, int64_t n, int64_t m, float smoothing, float dscale,
                         const float* dscale_dev, float* dz, double* loss, int64_t* greater,
                         cudaStream_t s) {
  if (n > 0)
    softmax_xent_fwd_kernel<<<unsigned(n), kThreads, 0, s>>>(z, labels, labels_b, lam, m, smoothing,
                                                             dscale, dscale_dev, dz, loss, greater);
  CUDA_CHECK_LAUNCH();
}

void launch_sgd(float* p, const float* g, float* m, const SgdChunk* chunks, int64_t nchunks,
                float lr, float momentum, bool nesterov, float grad_scale, const int* skip,
                const float* lr_dev, cudaStream_t s) {
  if (nchunks > 0)
    sgd_kernel<<<unsigned(nchunks), kThreads, 0, s>>>(p, g, m, chunks, lr, momentum, nesterov,
                                                      grad_scale, skip, lr_dev);
  CUDA_CHECK_LAUNCH();
}

void launch_lars(float* p, const float* g, float* m, const LarsChunk* chunks, int64_t nchunks,
                 double* partial, float lr, float momentum, bool nesterov, float grad_scale,
                 float eeta, float epsilon, const int* skip, const float* lr_dev, cudaStream_t s) {
  if (nchunks <= 0) return;
  lars_norms_kernel<<<unsigned(nchunks), kThreads, 0, s>>>(p, g, chunks, grad_scale, skip, partial);
  CUDA_CHECK_LAUNCH();
  lars_kernel<<<unsigned(nchunks), kThreads, 0, s>>>(p, g, m, chunks, partial, lr, momentum,
                                                     nesterov, grad_scale, eeta, epsilon, skip,
                                                     lr_dev);
  CUDA_CHECK_LAUNCH();
}

__global__ void lerp_kernel(float* d, const float* src, int64_t n, float weight) {
  GRID_STRIDE(i, n) d[i] = lerp_value(d[i], src[i], weight);
}

void launch_lerp(float* d, const float* src, int64_t n, float weight, cudaStream_t s) {
  if (n > 0) lerp_kernel<<<blocks_for(n), kThreads, 0, s>>>(d, src, n, weight);
  CUDA_CHECK_LAUNCH();
}

void launch_unscale_check(float* g, int64_t n, float inv_scale, const float* inv_dev, int* flag,
                          cudaStream_t s) {
  if (n > 0)
    unscale_check_kernel<<<blocks_for(n), kThreads, 0, s>>>(g, n, inv_scale, inv_dev, flag);
  CUDA_CHECK_LAUNCH();
}

}  // namespace spotrain::cuda
