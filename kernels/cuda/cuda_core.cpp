// CUDA backend: set-up and tear-down, the device allocator, profiling marks, data movement
// (compute stream, plus a copy stream for image uploads ordered with events), elementwise ops,
// global pooling, Linear with cuBLAS, the loss, SGD and LARS, the overflow check and the weights' moving
// average (our kernels, cuda_kernels.cu). Convolution is in cuda_conv.cpp, batch norm and max
// pooling in cuda_norm_pool.cpp, captured steps in cuda_graph.cpp.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "core/log.h"
#include "core/environment.h"
#include "kernels/device_info.h"
#include "kernels/cuda/cuda_entries.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/elementwise.h"

namespace spotrain::cuda {

namespace {
void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error; the allocator reports OOM
    return nullptr;
  }
  return p;
}
// Frees `p` once the device is idle: the allocator frees only cached blocks, but a kernel
// queued before the block was released may still be using it (cudaFree alone is synchronous
// only "for most use cases"). Called from a tensor's release, so it never throws: a failure
// is reported and cleared, so that it does not surface at an unrelated kernel's check; a
// block the wait failed for is left allocated rather than freed under work still using it.
void free_block(void* p) {
  const cudaError_t waited = cudaDeviceSynchronize();
  if (waited == cudaSuccess)
    CUDA_WARN(cudaFree(p));
  else
    std::fprintf(stderr, "warning: CUDA call failed: cudaDeviceSynchronize() before freeing a cached "
                 "device block: %s (the block is kept)\n", cudaGetErrorString(waited));
  (void)cudaGetLastError();
}

// Steps being recorded in this process (begin_recording to end/abort_recording), and the
// blocks of the recording thread's backend held back meanwhile (hold_device_frees).
std::atomic<int> g_recordings{0};
thread_local std::vector<void*>* t_held = nullptr;
// Blocks another thread released while a step was recorded: freed at the next free outside
// a recording.
std::mutex g_others_mu;
std::vector<void*> g_others_held;

// Reached when a cache is trimmed (out of memory, a cache limit), never in a steady-state
// step. While a step is being recorded nothing is freed: cudaDeviceSynchronize during a stream
// capture fails and invalidates the recording (its error then surfaces at some later kernel),
// and the recorded nodes may still use a block the recording's pool gave back.
void dev_free(void* p, size_t) {
  if (t_held) {
    t_held->push_back(p);
    return;
  }
  std::vector<void*> now;
  {
    std::lock_guard<std::mutex> lock(g_others_mu);
    if (g_recordings.load() > 0) {
      g_others_held.push_back(p);
      return;
    }
    now.swap(g_others_held);
  }
  now.push_back(p);
  for (void* q : now) free_block(q);
}

// Pinned host memory for loader batches. Loader worker threads allocate it: make the device
// current first, so a fresh thread does not create a context on device 0; portable, so any
// device's DMA engine may read it.
std::atomic<int> g_pinned_device{0};
void* pinned_host_alloc(size_t bytes) {
  void* p = nullptr;
  (void)cudaSetDevice(g_pinned_device.load());
  if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();  // the allocator reports the failure as out of memory
    return nullptr;
  }
  return p;
}
// Only cached blocks are freed, and upload_images keeps every source alive until its copy
// is done, so no DMA still reads `p`.
void pinned_host_free(void* p, size_t) { (void)cudaFreeHost(p); }

bool float_kind(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }

void check_same(const Tensor& a, const Tensor& b, const char* op) {
  SPOTRAIN_CHECK(float_kind(a.dtype()), op, ": unsupported dtype ", a.describe());
  SPOTRAIN_CHECK(a.shape() == b.shape() && a.layout() == b.layout() && a.dtype() == b.dtype() &&
                     a.storage_elems() == b.storage_elems(),
                 op, ": operands differ: ", a.describe(), " vs ", b.describe());
}
}  // namespace

void hold_device_frees(std::vector<void*>* held) {
  if (held && !t_held) ++g_recordings;
  if (!held && t_held) --g_recordings;
  t_held = held;
}

void free_held_blocks(std::vector<void*>& held) {
  for (void* p : held) free_block(p);
  held.clear();
}

// Never deleted: tensors may outlive the backend whose pool it is (the backend's end leaves it
// caching nothing), and cudaFree at process exit would race the driver's own teardown.
Allocator* new_device_allocator() {
  return new Allocator(Device::cuda, Allocator::Raw{dev_alloc, dev_free, false});
}

Allocator& pinned_host_allocator() {
  // Lives to process exit, like the device pools. Created by the first backend (whose
  // device is current), so the device recorded here is that backend's.
  static Allocator* a = [] {
    int dev = 0;
    if (cudaGetDevice(&dev) == cudaSuccess) g_pinned_device.store(dev);
    return new Allocator(Device::cpu, Allocator::Raw{pinned_host_alloc, pinned_host_free, false});
  }();
  return *a;
}

CudaBackend::CudaBackend(const BackendOptions& opt) : opt_(opt), pool_(new_device_allocator()) {
  CUDA_CHECK(cudaGetDevice(&device_));
  g_pinned_device.store(device_);
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  for (auto& st : staging_)
    CUDA_CHECK(cudaEventCreateWithFlags(&st.copied, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
  CUDNN_CHECK(cudnnCreate(&dnn_));
  CUDNN_CHECK(cudnnSetStream(dnn_, compute_));
  // SPOTRAIN_NO_FUSED_BN_ADD (core/environment.h): a diagnostic.
  fuse_bn_add_ = !test_hooks().no_fused_bn_add;
  CUBLAS_CHECK(blas::create(&blas_));
  CUBLAS_CHECK(blas::set_stream(blas_, compute_));
  CUBLAS_CHECK(
      blas::set_math_mode(blas_, opt.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  // A workspace of its own for cuBLAS (PyTorch's sizes: 32 MiB from Hopper on, else 4 MiB): its
  // default one is allocated inside the first call, which a captured step (--cuda-graph) must
  // not do, and freed behind a recorded graph's back.
  blas_workspace_bytes_ = size_t(prop.major >= 9 ? 32 : 4) << 20;
  CUDA_CHECK(cudaMalloc(&blas_workspace_, blas_workspace_bytes_));
  CUBLAS_CHECK(blas::set_workspace(blas_, blas_workspace_, blas_workspace_bytes_));
  size_t v = cudnnGetVersion();
  int blas_v = 0;
  CUBLAS_CHECK(blas::get_version(blas_, &blas_v));
  name_ = str("cuda (", prop.name, ", sm_", prop.major, prop.minor, ", cuDNN ", v / 10000, ".",
              (v % 10000) / 100, ".", v % 100, ", cuBLAS ", blas_v, opt.tf32 ? ", tf32" : "",
              opt.deterministic ? ", deterministic" : "", ")");
  // A timed choice holds for the same GPU model, driver and libraries: the key of its verdicts.
  int driver = 0;
  (void)cudaDriverGetVersion(&driver);
  const std::string release = gpu_info().driver;
  kernel_cache_ = std::make_unique<KernelCache>(
      opt.kernel_cache, str(prop.name, " sm_", prop.major, prop.minor, ", driver ",
                            release.empty() || release == "none" ? std::to_string(driver) : release,
                            ", cuDNN ", v,
                            ", cuBLAS ", blas_v));
  if (kernel_cache_->loaded() > 0)
    log_info(str("kernel cache ", kernel_cache_->path(), ": ", kernel_cache_->loaded(),
                 " timed choices for this GPU, driver and cuDNN"));
}

void CudaBackend::save_kernel_choices() {
  // After a step (train) or at the end (bench): how long the graphs planned so far took.
  if (plan_budget_.graphs > plan_graphs_said_) {
    plan_graphs_said_ = plan_budget_.graphs;
    log_info(str("fused cuDNN graphs: ", plan_budget_.graphs, " planned in ",
                 fmt_fixed(plan_budget_.seconds, 1), " s (", plan_budget_.engines, " engines tried, ",
                 fmt_fixed(plan_budget_.rival_seconds, 1), " s of it on engines to time",
                 plan_budget_.said_spent ? ": the budget was spent" : "", ")"));
  }
  if (kernel_cache_ && kernel_cache_->unsaved() > 0) kernel_cache_->save();
}

int CudaBackend::record_mark() {
  if (marks_used_ == marks_.size()) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    marks_.push_back(e);
  }
  CUDA_CHECK(cudaEventRecord(marks_[marks_used_], compute_));
  return int(marks_used_++);
}

std::vector<double> CudaBackend::read_marks_ms() {
  const size_t used = marks_used_;
  marks_used_ = 0;  // a failed read leaves no stale marks behind either
  std::vector<double> ms(used, 0.0);
  // A failure is thrown (a caller such as --fusion auto's timing may go on without it) with
  // the error cleared, so that it does not surface again at an unrelated kernel's check.
  auto check = [](cudaError_t st, const char* call) {
    if (st == cudaSuccess) return;
    (void)cudaGetLastError();
    SPOTRAIN_THROW("CUDA call failed: ", call, " reading the device clock's marks: ", cuda_msg(st));
  };
  if (used > 0) check(cudaEventSynchronize(marks_[used - 1]), "cudaEventSynchronize");
  for (size_t i = 1; i < used; ++i) {
    float v = 0.f;
    check(cudaEventElapsedTime(&v, marks_[0], marks_[i]), "cudaEventElapsedTime");
    ms[i] = v;
  }
  return ms;
}

void CudaBackend::synchronize() {
  SPOTRAIN_CHECK(!capturing_, "internal: synchronize while capturing a step");
  CUDA_CHECK(cudaStreamSynchronize(compute_));
  reap_pinned_uploads();  // the compute stream waited for every upload: all are done
}

void CudaBackend::reap_pinned_uploads() {
  cudaError_t err = cudaSuccess;
  size_t keep = 0;
  for (size_t i = 0; i < pinned_uploads_.size(); ++i) {
    PinnedUpload& u = pinned_uploads_[i];
    cudaError_t e = cudaEventQuery(u.copied);
    if (e == cudaSuccess) {
      free_events_.push_back(u.copied);
      u.source = Tensor();
      continue;
    }
    if (e == cudaErrorNotReady) {
      if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();  // not an error
    } else if (err == cudaSuccess) {
      err = e;
    }
    if (i != keep) pinned_uploads_[keep] = std::move(u);
    ++keep;
  }
  pinned_uploads_.resize(keep);
  CUDA_CHECK(err);
}

Tensor CudaBackend::alloc(const Shape& shape, DType dt, Layout layout) {
  Tensor t(shape, dt, allocator(), layout);
  if (opt_.poison && t.nbytes() > 0)
    CUDA_CHECK(cudaMemsetAsync(t.raw(), 0xff, t.nbytes(), compute_));
  return t;
}

void* CudaBackend::workspace(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (!workspace_.defined() || workspace_.nbytes() < bytes) {
    // The nodes recorded so far still use the old one: the graph keeps it.
    if (capturing_ && workspace_.defined()) graph_refs_.push_back(workspace_);
    workspace_ = Tensor({int64_t((bytes + 3) / 4)}, DType::f32, allocator());
  }
  return workspace_.raw();
}

const float* CudaBackend::aligned(const Tensor& t, Tensor& holder) {
  if (reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0) return t.data<float>();
  holder = Tensor(t.shape(), DType::f32, allocator());
  CUDA_CHECK(cudaMemcpyAsync(holder.raw(), t.raw(), size_t(t.numel()) * 4, cudaMemcpyDeviceToDevice,
                             compute_));
  return holder.data<float>();
}

void* CudaBackend::pinned(size_t bytes) {
  if (pinned_bytes_ < bytes) {
    if (pinned_) CUDA_CHECK(cudaFreeHost(pinned_));
    pinned_ = nullptr;
    size_t n = bytes < 4096 ? 4096 : bytes;
    CUDA_CHECK(cudaMallocHost(&pinned_, n));
    pinned_bytes_ = n;
  }
  return pinned_;
}

// ---- data movement ---------------------------------------------------------------------------

Tensor CudaBackend::upload_images_impl(const Tensor& host, DType compute) {
  SPOTRAIN_CHECK(host.ndim() == 4 && host.layout() == Layout::nhwc && host.dtype() == DType::f32 &&
                     host.device() == Device::cpu,
                 "upload_images expects a host fp32 NHWC batch, got ", host.describe());
  Tensor dev = copy_batch_up(host);
  return compute == DType::f32 ? dev : cast(dev, compute);
}

Tensor CudaBackend::upload_pixels_impl(const Tensor& host, const PixelNorm& norm, DType compute) {
  check_pixel_batch(host, compute);
  Tensor dev = copy_batch_up(host);
  Tensor out(host.shape(), compute, allocator(), Layout::nhwc);
  PixelAffine a;
  a.channels = int(host.dim(1));
  for (int k = 0; k < 3; ++k) {
    a.scale[k] = norm.scale(k);
    a.shift[k] = norm.shift(k);
  }
  launch_normalize_pixels(static_cast<const uint8_t*>(dev.raw()), out.write_raw(), compute,
                          host.numel(), a, compute_);
  return out;
}

Tensor CudaBackend::copy_batch_up(const Tensor& host) {
  Tensor dev(host.shape(), host.dtype(), allocator(), Layout::nhwc);
  size_t bytes = host.nbytes();
  reap_pinned_uploads();
  if (bytes > 0 && host.storage()->alloc == &pinned_host_allocator()) {
    // Page-locked source (the loader wrote it there): one async DMA straight from it. The
    // source stays referenced until the copy is done; ordering as below.
    cudaEvent_t ev = nullptr;
    if (free_events_.empty()) {
      CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    } else {
      ev = free_events_.back();
      free_events_.pop_back();
    }
    pinned_uploads_.push_back(PinnedUpload{host, ev});  // owns `ev` from here on
    CUDA_CHECK(cudaEventRecord(compute_mark_, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(copy_, compute_mark_, 0));
    CUDA_CHECK(cudaMemcpyAsync(dev.raw(), host.raw(), bytes, cudaMemcpyHostToDevice, copy_));
    CUDA_CHECK(cudaEventRecord(ev, copy_));
    CUDA_CHECK(cudaStreamWaitEvent(compute_, ev, 0));
  } else if (bytes > 0) {
    // The staging buffer of two uploads ago: refilled once its copy finished (long since,
    // in a training loop), so the host never waits for the step before.
    Staging& st = staging_[next_staging_];
    next_staging_ = 1 - next_staging_;
    if (st.pending) CUDA_CHECK(cudaEventSynchronize(st.copied));
    st.pending = false;
    if (st.bytes < bytes) {
      if (st.host) CUDA_CHECK(cudaFreeHost(st.host));
      st.host = nullptr;
      st.bytes = 0;
      CUDA_CHECK(cudaHostAlloc(&st.host, bytes, cudaHostAllocDefault));
      st.bytes = bytes;
    }
    // `dev` may be memory the compute stream released: the copy starts after the work queued
    // so far (a wait on the GPU; the host goes on), and the compute stream waits for the copy.
    CUDA_CHECK(cudaEventRecord(compute_mark_, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(copy_, compute_mark_, 0));
    st.pending = true;  // from here on copies out of st.host may be queued
    try {
      stage_and_copy(host.raw(), st.host, dev.raw(), bytes);
    } catch (...) {
      (void)cudaEventRecord(st.copied, copy_);  // what was queued still reads st.host
      throw;
    }
    CUDA_CHECK(cudaEventRecord(st.copied, copy_));
    CUDA_CHECK(cudaStreamWaitEvent(compute_, st.copied, 0));
  }
  return dev;
}

void CudaBackend::stage_and_copy(const void* src, void* staging, void* dst, size_t bytes) {
  constexpr size_t kChunk = size_t(8) << 20;
  size_t chunks = (bytes + kChunk - 1) / kChunk;
  size_t threads = std::max(1u, std::thread::hardware_concurrency() / 2);
  threads = std::min({threads, size_t(8), chunks});
  // Copies [begin, end) chunk by chunk, queueing each chunk's DMA as soon as it is staged.
  auto copy_range = [&](size_t begin, size_t end) {
    cudaError_t e = cudaSetDevice(device_);  // a new host thread starts on device 0
    for (size_t off = begin; e == cudaSuccess && off < end; off += kChunk) {
      size_t n = std::min(kChunk, end - off);
      std::memcpy(static_cast<char*>(staging) + off, static_cast<const char*>(src) + off, n);
      e = cudaMemcpyAsync(static_cast<char*>(dst) + off, static_cast<const char*>(staging) + off, n,
                          cudaMemcpyHostToDevice, copy_);
    }
    return e;
  };
  if (threads <= 1) {
    CUDA_CHECK(copy_range(0, bytes));
    return;
  }
  // Whole chunks per thread; this thread takes the first share.
  size_t per = (chunks + threads - 1) / threads * kChunk;
  std::vector<cudaError_t> status(threads, cudaSuccess);
  std::vector<std::thread> workers;
  for (size_t t = 1; t < threads; ++t) {
    size_t b = std::min(bytes, t * per), e = std::min(bytes, (t + 1) * per);
    try {
      workers.emplace_back([&, t, b, e] { status[t] = copy_range(b, e); });
    } catch (const std::system_error&) {  // no thread to spare: this one copies the share
      status[t] = copy_range(b, e);
    }
  }
  status[0] = copy_range(0, std::min(bytes, per));
  for (auto& w : workers) w.join();
  for (cudaError_t s : status) CUDA_CHECK(s);
}

Tensor CudaBackend::cast_impl(const Tensor& t, DType to) {
  check_device(t, "cast");
  SPOTRAIN_CHECK(float_kind(t.dtype()) && float_kind(to), "cast: unsupported conversion ",
                 dtype_name(t.dtype()), " -> ", dtype_name(to));
  Tensor out(t.shape(), to, allocator(), t.layout(), t.storage_elems());
  if (opt_.poison && out.nbytes() > 0)
    CUDA_CHECK(cudaMemsetAsync(out.raw(), 0xff, out.nbytes(), compute_));
  if (t.dtype() == to)
    CUDA_CHECK(cudaMemcpyAsync(out.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToDevice, compute_));
  else
    launch_cast(t.raw(), t.dtype(), out.raw(), to, t.storage_elems(), compute_);
  return out;
}

Tensor CudaBackend::to_host(const Tensor& t0) {
  SPOTRAIN_CHECK(float_kind(t0.dtype()), "to_host: unsupported dtype ", t0.describe());
  Tensor t = t0.device() == Device::cuda && t0.dtype() != DType::f32 ? cast(t0, DType::f32) : t0;
  SPOTRAIN_CHECK(t.dtype() == DType::f32, "to_host: only fp32 host tensors, got ", t.describe());
  bool nhwc = t.ndim() == 4 && t.layout() == Layout::nhwc;
  Tensor raw = Tensor::host(t.shape(), DType::f32, nhwc ? Layout::nhwc : Layout::plain);
  CUDA_CHECK(
      cudaMemcpyAsync(raw.raw(), t.raw(), size_t(t.numel()) * 4, cudaMemcpyDefault, compute_));
  CUDA_CHECK(cudaStreamSynchronize(compute_));
  if (!nhwc) return raw.reshaped(t.shape(), Layout::plain);
  SPOTRAIN_CHECK(t.layout() != Layout::blocked, "to_host: blocked layout on the GPU");
  Tensor out = Tensor::host(t.shape());
  int64_t n = t.dim(0), c = t.dim(1), hw = t.dim(2) * t.dim(3);
  const float* s = raw.data<float>();
  float* d = out.data<float>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < hw; ++p)
      for (int64_t ch = 0; ch < c; ++ch) d[(i * c + ch) * hw + p] = s[(i * hw + p) * c + ch];
  return out;
}

namespace {
bool is_pinned(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}
}  // namespace

void CudaBackend::copy_to_host(const Tensor& src, Tensor& host_dst) {
  copy_to_host_async(src, host_dst)();
}

std::function<void()> CudaBackend::copy_to_host_async(const Tensor& src, Tensor& host_dst) {
  SPOTRAIN_CHECK(src.device() == Device::cuda && src.dtype() == DType::f32 &&
                     host_dst.device() == Device::cpu && host_dst.dtype() == DType::f32 &&
                     host_dst.numel() == src.numel(),
                 "copy_to_host: ", src.describe(), " into ", host_dst.describe());
  if (!is_pinned(host_dst.raw())) {  // pageable: cuda copies through a bounce buffer, waiting
    Backend::copy_to_host(src, host_dst);
    return [] {};
  }
  CUDA_CHECK(cudaMemcpyAsync(host_dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToHost,
                             compute_));
  cudaEvent_t ev;
  CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(ev, compute_));
  // The event outlives the backend's streams safely; the last holder waits and frees it. The
  // holder may be another thread (the checkpoint writer's): it makes this rank's GPU its
  // current device first, or CUDA would make a context on GPU 0 for it in every rank.
  const int device = device_;
  std::shared_ptr<CUevent_st> done(ev, [device](cudaEvent_t e) {
    CUDA_WARN(cudaSetDevice(device));
    CUDA_WARN(cudaEventSynchronize(e));
    CUDA_WARN(cudaEventDestroy(e));
  });
  return [done, device] {
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaEventSynchronize(done.get()));
  };
}

Tensor CudaBackend::from_host(const Tensor& t) {
  Tensor out(t.shape(), t.dtype(), allocator(), t.layout(), t.storage_elems());
  CUDA_CHECK(cudaMemcpyAsync(out.raw(), t.raw(), t.nbytes(), cudaMemcpyDefault, compute_));
  return out;
}

Tensor CudaBackend::zeros_impl(const Shape& shape) {
  Tensor t(shape, DType::f32, allocator());
  if (t.nbytes() > 0) CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, t.nbytes(), compute_));
  return t;
}

void CudaBackend::fill_impl(Tensor& t, float value) {
  t.mark_written();
  check_device(t, "fill");
  SPOTRAIN_CHECK(t.dtype() == DType::f32, "fill: fp32 tensors only, got ", t.describe());
  launch_fill_f32(t.data<float>(), value, t.storage_elems(), compute_);
}

void CudaBackend::copy_impl(const Tensor& src, Tensor& dst) {
  dst.mark_written();
  SPOTRAIN_CHECK(src.nbytes() == dst.nbytes(), "copy: size mismatch ", src.describe(), " vs ",
                 dst.describe());
  if (src.nbytes() > 0)
    CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDefault, compute_));
}

// ---- elementwise ------------------------------------------------------------------------------

Tensor CudaBackend::relu_forward_impl(const Tensor& x) {
  check_device(x, "relu");
  SPOTRAIN_CHECK(float_kind(x.dtype()), "relu: unsupported dtype ", x.describe());
  Tensor y = alloc_like(x);
  launch_relu_fwd(x.raw(), y.raw(), x.dtype(), x.numel(), compute_);
  return y;
}

Tensor CudaBackend::relu_backward_impl(const Tensor& dy, const Tensor& y) {
  check_device(y, "relu_backward");
  check_same(dy, y, "relu_backward");
  Tensor dx = alloc_like(y);
  launch_relu_bwd(dy.raw(), y.raw(), dx.raw(), y.dtype(), y.numel(), compute_);
  return dx;
}

Tensor CudaBackend::add_forward_impl(const Tensor& a, const Tensor& b, bool relu) {
  check_device(a, "add");
  check_same(a, b, "add");
  Tensor y = alloc_like(a);
  launch_add_fwd(a.raw(), b.raw(), y.raw(), a.dtype(), a.numel(), relu, compute_);
  return y;
}

Tensor CudaBackend::add_backward_impl(const Tensor& dy, const Tensor& y, bool relu) {
  if (!relu) return dy;
  return relu_backward(dy, y);
}

// ---- global average pooling --------------------------------------------------------------------

Tensor CudaBackend::global_avgpool_forward_impl(const Tensor& x) {
  check_device(x, "global_avgpool");
  SPOTRAIN_CHECK(x.ndim() == 4 && x.layout() == Layout::nhwc && float_kind(x.dtype()),
                 "global_avgpool: expected an NHWC activation, got ", x.describe());
  int64_t n = x.dim(0), c = x.dim(1), hw = x.dim(2) * x.dim(3);
  Tensor y = alloc({n, c}, DType::f32);
  launch_gap_fwd(x.raw(), x.dtype(), y.data<float>(), n, c, hw, compute_);
  return y;
}

Tensor CudaBackend::global_avgpool_backward_impl(const Tensor& dy, const Tensor& x) {
  check_device(dy, "global_avgpool_backward");
  SPOTRAIN_CHECK(x.ndim() == 4 && x.layout() == Layout::nhwc && dy.dtype() == DType::f32 &&
                     dy.numel() == x.dim(0) * x.dim(1),
                 "global_avgpool_backward: gradient ", dy.describe(), " does not match ",
                 x.describe());
  Tensor dx = alloc_like(x);
  launch_gap_bwd(dy.data<float>(), dx.raw(), x.dtype(), x.dim(0), x.dim(1), x.dim(2) * x.dim(3),
                 compute_);
  return dx;
}

// ---- linear (row-major tensors seen by column-major cuBLAS as their transposes) ---------------

Tensor CudaBackend::linear_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_device(x, "linear");
  SPOTRAIN_CHECK(x.ndim() == 2 && w.ndim() == 2 && x.dim(1) == w.dim(1) &&
                     x.dtype() == DType::f32 && b.numel() == w.dim(0),
                 "linear: input ", x.describe(), " does not match weights ", w.describe());
  int64_t n = x.dim(0), k = x.dim(1), m = w.dim(0);
  Tensor y = alloc({n, m}, DType::f32);
  launch_bias_rows(y.data<float>(), b.data<float>(), n, m, compute_);
  if (n == 0 || m == 0) return y;
  const float one = 1.f;
  // y^T (m, n) = w (m, k) x^T (k, n) + y^T
  CUBLAS_CHECK(blas::sgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(m), int(n), int(k), &one,
                           w.data<float>(), int(k), x.data<float>(), int(k), &one, y.data<float>(),
                           int(m)));
  return y;
}

Tensor CudaBackend::linear_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw,
                                         Tensor& db, bool need_dx) {
  check_device(dy, "linear_backward");
  int64_t n = x.dim(0), k = x.dim(1), m = w.dim(0);
  SPOTRAIN_CHECK(
      dy.ndim() == 2 && dy.dim(0) == n && dy.dim(1) == m && dw.numel() == m * k && db.numel() == m,
      "linear_backward: gradient ", dy.describe(), " does not match ", w.describe());
  const float one = 1.f, zero = 0.f;
  // dw^T (k, m) = x^T (k, n) dy (n, m)
  CUBLAS_CHECK(blas::sgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, int(k), int(m), int(n), &one,
                           x.data<float>(), int(k), dy.data<float>(), int(m), &zero,
                           dw.data<float>(), int(k)));
  launch_col_sum(dy.data<float>(), db.data<float>(), n, m, compute_);
  if (!need_dx) return Tensor();
  Tensor dx = alloc({n, k}, DType::f32);
  // dx^T (k, n) = w^T (k, m) dy^T (m, n)
  CUBLAS_CHECK(blas::sgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, int(k), int(n), int(m), &one,
                           w.data<float>(), int(k), dy.data<float>(), int(m), &zero,
                           dx.data<float>(), int(k)));
  return dx;
}

// ---- loss ---------------------------------------------------------------------------------------

LossResult CudaBackend::softmax_xent_impl(const Tensor& logits, const int32_t* labels, float smoothing,
                                          float grad_scale, Tensor* dlogits, const LabelMix* mix) {
  softmax_xent_queue(logits, labels, smoothing, grad_scale, dlogits, mix);
  return queued_loss();
}

void CudaBackend::softmax_xent_queue_impl(const Tensor& logits, const int32_t* labels, float smoothing,
                                          float grad_scale, Tensor* dlogits, const LabelMix* mix) {
  check_device(logits, "softmax_xent");
  SPOTRAIN_CHECK(logits.ndim() == 2 && logits.dtype() == DType::f32,
                 "softmax_xent: logits must be fp32 (N, classes), got ", logits.describe());
  int64_t n = logits.dim(0), m = logits.dim(1);
  loss_rows_ = n;
  if (n == 0) return;
  for (int64_t i = 0; i < n; ++i)
    SPOTRAIN_CHECK(labels[i] >= 0 && labels[i] < m, "softmax_xent: label ", labels[i],
                   " outside [0, ", m, ")");
  if (mix)
    for (int64_t i = 0; i < n; ++i)
      SPOTRAIN_CHECK(mix->labels_b[i] >= 0 && mix->labels_b[i] < m, "softmax_xent: label ",
                     mix->labels_b[i], " outside [0, ", m, ")");
  // Labels, and with mixed targets the second labels and weights: one upload, or, while a
  // step is recorded, the block each replay refills (see cuda_graph.cpp).
  Tensor lab;
  const int32_t* dev = nullptr;
  if (capturing_) {
    SPOTRAIN_CHECK(n == graph_batch_ && (mix != nullptr) == graph_mixed_,
                   "internal: the recorded loss does not match begin_recording");
    SPOTRAIN_CHECK(loss_host_.defined() && loss_host_.numel() >= 4 * n,
                   "internal: the first step of a batch size was captured");
    graph_classes_ = m;
    dev = static_cast<const int32_t*>(graph_in_.raw()) + kGraphScalars;
  } else {
    lab = Tensor({mix ? 3 * n : n}, DType::i32, allocator());
    int32_t* up = lab.data<int32_t>();
    CUDA_CHECK(cudaMemcpyAsync(up, labels, size_t(n) * 4, cudaMemcpyHostToDevice, compute_));
    if (mix) {
      CUDA_CHECK(cudaMemcpyAsync(up + n, mix->labels_b, size_t(n) * 4, cudaMemcpyHostToDevice, compute_));
      CUDA_CHECK(cudaMemcpyAsync(up + 2 * n, mix->lam, size_t(n) * 4, cudaMemcpyHostToDevice, compute_));
    }
    dev = up;
  }
  const int32_t* labels_b = mix ? dev + n : nullptr;
  const float* lam = mix ? reinterpret_cast<const float*>(dev + 2 * n) : nullptr;
  if (dlogits && !dlogits->defined()) *dlogits = alloc({n, m}, DType::f32);
  float* dz = dlogits ? dlogits->data<float>() : nullptr;
  Tensor rows({4 * n}, DType::f32, allocator());  // (n) doubles, then (n) int64 counts
  double* loss = reinterpret_cast<double*>(rows.raw());
  int64_t* greater = reinterpret_cast<int64_t*>(loss + n);
  launch_softmax_xent(logits.data<float>(), dev, labels_b, lam, n, m, smoothing,
                      grad_scale / float(n), graph_scalar(1), dz, loss, greater, compute_);
  if (!loss_ready_) CUDA_CHECK(cudaEventCreateWithFlags(&loss_ready_, cudaEventDisableTiming));
  if (!loss_host_.defined() || loss_host_.numel() < 4 * n) {
    CUDA_CHECK(cudaEventSynchronize(loss_ready_));  // a previous copy may still write the old one
    loss_host_ = Tensor({4 * n}, DType::f32, pinned_host_allocator());
  }
  CUDA_CHECK(cudaMemcpyAsync(loss_host_.raw(), rows.raw(), size_t(n) * 16,
                             cudaMemcpyDeviceToHost, compute_));
  if (!capturing_) CUDA_CHECK(cudaEventRecord(loss_ready_, compute_));  // replays record it
}

void CudaBackend::mark_step_begin() {
  if (capturing_) return;
  span_marking_ = 1 - span_marking_;
  for (cudaEvent_t& e : span_[span_marking_])
    if (!e) CUDA_CHECK(cudaEventCreate(&e));
  CUDA_CHECK(cudaEventRecord(span_[span_marking_][0], compute_));
}

void CudaBackend::mark_step_backward_done() {
  if (capturing_ || !span_[span_marking_][0]) return;
  CUDA_CHECK(cudaEventRecord(span_[span_marking_][1], compute_));
  span_done_ = span_marking_;
}

double CudaBackend::step_span_seconds() {
  if (span_done_ < 0) return -1;
  cudaEvent_t* pair = span_[span_done_];
  float ms = 0.f;
  CUDA_CHECK(cudaEventSynchronize(pair[1]));
  CUDA_CHECK(cudaEventElapsedTime(&ms, pair[0], pair[1]));
  return double(ms) / 1000.0;
}

LossResult CudaBackend::queued_loss() {
  SPOTRAIN_CHECK(loss_rows_ >= 0, "internal: queued_loss without softmax_xent_queue");
  LossResult r;
  const int64_t n = loss_rows_;
  loss_rows_ = -1;
  if (n == 0) return r;
  CUDA_CHECK(cudaEventSynchronize(loss_ready_));
  const double* hl = reinterpret_cast<const double*>(loss_host_.raw());
  const int64_t* hg = reinterpret_cast<const int64_t*>(hl + n);
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    total += hl[i];
    r.top1 += hg[i] == 0;
    r.top5 += hg[i] < 5;
  }
  r.loss = total / double(n);
  return r;
}

// ---- optimizer
// ------------------------------------------------------------------------------------

void CudaBackend::sgd_step_impl(Tensor& params, const Tensor& grads, Tensor& momentum,
                                const std::vector<SgdSegment>& segments, const SgdHyper& h) {
  params.mark_written();
  check_device(params, "sgd_step");
  check_device(grads, "sgd_step");
  check_device(momentum, "sgd_step");
  bool same = segments.size() == sgd_segments_.size();
  for (size_t i = 0; same && i < segments.size(); ++i)
    same = segments[i].offset == sgd_segments_[i].offset &&
           segments[i].count == sgd_segments_[i].count &&
           segments[i].weight_decay == sgd_segments_[i].weight_decay;
  if (!same || !sgd_chunks_.defined()) {
    SPOTRAIN_CHECK(!capturing_, "internal: the SGD segments changed while capturing a step");
    std::vector<SgdChunk> chunks;
    for (const auto& s : segments) {
      SPOTRAIN_CHECK(s.offset >= 0 && s.offset + s.count <= params.numel(),
                     "sgd_step: segment outside the parameter buffer");
      for (int64_t o = 0; o < s.count; o += kSgdChunk)
        chunks.push_back(SgdChunk{s.offset + o, int32_t(std::min<int64_t>(kSgdChunk, s.count - o)),
                                  s.weight_decay});
    }
    static_assert(sizeof(SgdChunk) == 16, "SgdChunk is 16 bytes");
    sgd_nchunks_ = int64_t(chunks.size());
    sgd_chunks_ = Tensor({std::max<int64_t>(1, sgd_nchunks_) * 4}, DType::f32, allocator());
    if (!chunks.empty())
      CUDA_CHECK(cudaMemcpyAsync(sgd_chunks_.raw(), chunks.data(), chunks.size() * sizeof(SgdChunk),
                                 cudaMemcpyHostToDevice, compute_));
    sgd_segments_ = segments;
  }
  SPOTRAIN_CHECK(!h.skip_on_overflow || overflow_flag_.defined(),
                 "internal: sgd_step skip_on_overflow before any unscale_check_queue");
  launch_sgd(params.data<float>(), grads.data<float>(), momentum.data<float>(),
             static_cast<const SgdChunk*>(sgd_chunks_.raw()), sgd_nchunks_, h.lr, h.momentum,
             h.nesterov, h.grad_scale, h.skip_on_overflow ? overflow_flag_.data<int>() : nullptr,
             graph_scalar(0), compute_);
}

void CudaBackend::lars_step_impl(Tensor& params, const Tensor& grads, Tensor& momentum,
                                 const std::vector<LarsSegment>& segments, const LarsHyper& h) {
  params.mark_written();
  check_device(params, "lars_step");
  check_device(grads, "lars_step");
  check_device(momentum, "lars_step");
  bool same = segments.size() == lars_segments_.size();
  for (size_t i = 0; same && i < segments.size(); ++i)
    same = segments[i].offset == lars_segments_[i].offset &&
           segments[i].count == lars_segments_[i].count &&
           segments[i].weight_decay == lars_segments_[i].weight_decay &&
           segments[i].adapt == lars_segments_[i].adapt;
  if (!same || !lars_chunks_.defined()) {
    SPOTRAIN_CHECK(!capturing_, "internal: the LARS segments changed while capturing a step");
    std::vector<LarsChunk> chunks;
    for (const auto& s : segments) {
      SPOTRAIN_CHECK(s.offset >= 0 && s.count >= 0 && s.offset + s.count <= params.numel(),
                     "lars_step: segment outside the parameter buffer");
      const int32_t first = int32_t(chunks.size());
      const int32_t n = int32_t((s.count + kSgdChunk - 1) / kSgdChunk);
      for (int64_t o = 0; o < s.count; o += kSgdChunk)
        chunks.push_back(LarsChunk{s.offset + o, int32_t(std::min<int64_t>(kSgdChunk, s.count - o)),
                                   s.weight_decay, first, n, s.adapt ? 1 : 0, 0});
    }
    static_assert(sizeof(LarsChunk) == 32, "LarsChunk is 32 bytes");
    lars_nchunks_ = int64_t(chunks.size());
    const int64_t rows = std::max<int64_t>(1, lars_nchunks_);
    lars_chunks_ = Tensor({rows * 8}, DType::f32, allocator());
    lars_partials_ = Tensor({rows * 4}, DType::f32, allocator());  // (rows, 2) doubles
    if (!chunks.empty())
      CUDA_CHECK(cudaMemcpyAsync(lars_chunks_.raw(), chunks.data(), chunks.size() * sizeof(LarsChunk),
                                 cudaMemcpyHostToDevice, compute_));
    lars_segments_ = segments;
  }
  SPOTRAIN_CHECK(!h.skip_on_overflow || overflow_flag_.defined(),
                 "internal: lars_step skip_on_overflow before any unscale_check_queue");
  launch_lars(params.data<float>(), grads.data<float>(), momentum.data<float>(),
              static_cast<const LarsChunk*>(lars_chunks_.raw()), lars_nchunks_,
              static_cast<double*>(lars_partials_.write_raw()), h.lr, h.momentum, h.nesterov,
              h.grad_scale, h.trust, h.epsilon,
              h.skip_on_overflow ? overflow_flag_.data<int>() : nullptr, graph_scalar(0), compute_);
}

void CudaBackend::lerp_impl(Tensor& dst, const Tensor& src, float weight) {
  check_device(dst, "lerp");
  check_device(src, "lerp");
  SPOTRAIN_CHECK(dst.numel() == src.numel() && dst.dtype() == DType::f32 && src.dtype() == DType::f32,
                 "lerp: fp32 tensors of one size, got ", dst.describe(), " and ", src.describe());
  dst.mark_written();
  launch_lerp(dst.data<float>(), src.data<float>(), dst.numel(), weight, compute_);
}

bool CudaBackend::unscale_and_check_impl(Tensor& grads, float inv_scale) {
  unscale_check_queue(grads, inv_scale);
  return queued_overflow();  // the caller must know the verdict now
}

void CudaBackend::unscale_check_queue_impl(Tensor& grads, float inv_scale) {
  check_device(grads, "unscale_and_check");
  if (!overflow_flag_.defined()) {
    SPOTRAIN_CHECK(!capturing_, "internal: the first fp16 step was captured");
    overflow_flag_ = Tensor({1}, DType::i32, allocator());
    overflow_host_ = Tensor({1}, DType::i32, pinned_host_allocator());
    CUDA_CHECK(cudaEventCreateWithFlags(&overflow_ready_, cudaEventDisableTiming));
  }
  // The flag is cleared and written in stream order, after the sgd_step that read the last one.
  CUDA_CHECK(cudaMemsetAsync(overflow_flag_.raw(), 0, 4, compute_));
  launch_unscale_check(grads.data<float>(), grads.numel(), inv_scale, graph_scalar(2),
                       overflow_flag_.data<int>(), compute_);
  CUDA_CHECK(cudaMemcpyAsync(overflow_host_.raw(), overflow_flag_.raw(), 4, cudaMemcpyDeviceToHost,
                             compute_));
  if (!capturing_) CUDA_CHECK(cudaEventRecord(overflow_ready_, compute_));  // replays record it
}

bool CudaBackend::queued_overflow() {
  SPOTRAIN_CHECK(overflow_flag_.defined(), "internal: queued_overflow without unscale_check_queue");
  CUDA_CHECK(cudaEventSynchronize(overflow_ready_));
  return *static_cast<const int*>(overflow_host_.raw()) != 0;
}

// Here, where the cache entries are complete types.
CudaBackend::~CudaBackend() {
  // No throwing here: report and go on.
  drop();
  try {
    save_kernel_choices();  // what the last steps or an evaluation timed
  } catch (...) {
  }
  if (graph_in_copied_) CUDA_WARN(cudaEventDestroy(graph_in_copied_));
  if (compute_) CUDA_WARN(cudaStreamSynchronize(compute_));
  if (copy_) CUDA_WARN(cudaStreamSynchronize(copy_));
  for (auto& u : pinned_uploads_) free_events_.push_back(u.copied);
  pinned_uploads_.clear();  // every copy is done: the sources may go back to the loader
  for (cudaEvent_t ev : free_events_) CUDA_WARN(cudaEventDestroy(ev));
  free_events_.clear();
  for (cudaEvent_t ev : marks_) CUDA_WARN(cudaEventDestroy(ev));
  marks_.clear();
  if (loss_ready_) CUDA_WARN(cudaEventDestroy(loss_ready_));
  if (overflow_ready_) CUDA_WARN(cudaEventDestroy(overflow_ready_));
  loss_host_ = Tensor();
  overflow_flag_ = Tensor();
  overflow_host_ = Tensor();
  conv_cache_.clear();
  bn_cache_.clear();
  weight_copies_.clear();
  workspace_ = Tensor();
  sgd_chunks_ = Tensor();
  lars_chunks_ = Tensor();
  lars_partials_ = Tensor();
  if (pinned_) CUDA_WARN(cudaFreeHost(pinned_));
  if (blas_) CUBLAS_WARN(blas::destroy(blas_));
  if (blas_workspace_) CUDA_WARN(cudaFree(blas_workspace_));
  if (dnn_) CUDNN_WARN(cudnnDestroy(dnn_));
  for (auto& st : staging_) {
    if (st.host) CUDA_WARN(cudaFreeHost(st.host));
    if (st.copied) CUDA_WARN(cudaEventDestroy(st.copied));
  }
  if (compute_mark_) CUDA_WARN(cudaEventDestroy(compute_mark_));
  for (auto& pair : span_)
    for (cudaEvent_t e : pair)
      if (e) CUDA_WARN(cudaEventDestroy(e));
  if (copy_) CUDA_WARN(cudaStreamDestroy(copy_));
  if (compute_) CUDA_WARN(cudaStreamDestroy(compute_));
  // Nothing of this backend runs any more: its pools let go of their cache, and of every
  // block a surviving tensor frees later.
  pool_->set_cache_limit(0);
  if (graph_pool_) graph_pool_->set_cache_limit(0);
}

}  // namespace spotrain::cuda
