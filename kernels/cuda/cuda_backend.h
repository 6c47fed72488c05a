// The CUDA backend: cuDNN 9 for convolution (algorithm chosen once per shape) and batch norm,
// cuBLAS for Linear, our own kernels (cuda_kernels.cu) for the rest, max pooling included.
// Activations are NHWC in the compute dtype; weights are converted once per optimizer step
// from the fp32 OIHW masters to (O, H, W, I) in the compute dtype. Internal to kernels/cuda/.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cudnn_graph.h"
#include "kernels/op_profiler.h"
#include "kernels/ops.h"
#include "kernels/step_capture.h"
#include "kernels/kernel_cache.h"

namespace spotrain::cuda {

// A caching device allocator (cudaMalloc/cudaFree as its raw source). Each backend has its
// own, and a captured step another: a block a tensor frees goes back to the pool of the
// stream that may still be using it, never to another backend's stream.
Allocator* new_device_allocator();
// While a step is recorded on this thread, frees of the device pools (a trim: out of memory,
// a cache limit) are held in `held` (every other thread's too, until the next free after the
// recording): a wait for the device would invalidate the recording, and its nodes may still
// use a block its pool gave back. nullptr ends the holding; free_held_blocks frees them.
void hold_device_frees(std::vector<void*>* held);
void free_held_blocks(std::vector<void*>& held);
// The process-wide caching pinned host allocator (cudaHostAlloc/cudaFreeHost): Device::cpu
// memory the DMA engine reads directly.
Allocator& pinned_host_allocator();

class CudaBackend final : public Backend, public StepCapture, public DeviceClock {
 public:
  explicit CudaBackend(const BackendOptions& opt);
  ~CudaBackend() override;

  Device device() const override { return Device::cuda; }
  std::string name() const override { return name_; }
  std::string gpu_pci_bus_id() const override;
  std::string device_line() const override;
  std::vector<std::string> kernel_choices() override;
  void save_kernel_choices() override;
  bool normalizes_pixels() const override { return true; }  // one kernel (upload_pixels_impl)
  // cuDNN's fusion graphs: 16-bit, and not under --deterministic (cuda_fusion.cpp).
  bool fuses_conv_bn(DType compute) const override {
    return compute != DType::f32 && !opt_.deterministic;
  }
  Allocator& allocator() override { return capturing_ ? *graph_pool_ : *pool_; }

  Allocator& host_staging_allocator() override { return pinned_host_allocator(); }
  Tensor to_host(const Tensor& t) override;
  Tensor from_host(const Tensor& t) override;
  void copy_to_host(const Tensor& src, Tensor& host_dst) override;
  std::function<void()> copy_to_host_async(const Tensor& src, Tensor& host_dst) override;

  LossResult queued_loss() override;
  void mark_step_begin() override;
  void mark_step_backward_done() override;
  double step_span_seconds() override;
  bool queued_overflow() override;
  void synchronize() override;
  bool queues_ops() const override { return true; }
  DeviceStream* stream() override { return reinterpret_cast<DeviceStream*>(compute_); }
  StepCapture* capture() override { return this; }
  DeviceClock* device_clock() override { return this; }
  KernelCache* kernel_cache() override { return kernel_cache_.get(); }
  // Fused graphs planned from now on take the heuristics' first engine, untimed.
  bool kernel_timing_cut() const override {
    return opt_.autotune && plan_budget_.rival_seconds >= plan_budget_.limit;
  }
  cudaStream_t compute_stream() const { return compute_; }

  // StepCapture (cuda_graph.cpp)
  void begin_recording(int64_t batch, bool mixed) override;
  void end_recording() override;
  void abort_recording() override;
  void replay(const StepInputs& in) override;
  void drop() override;
  size_t reserved_bytes() const override {
    return graph_exec_ ? graph_pool_->stats().reserved_bytes : 0;
  }

  // DeviceClock (cuda_core.cpp)
  int record_mark() override;
  std::vector<double> read_marks_ms() override;

 protected:
  // The ops (kernels/ops.h): cuda_core.cpp (data movement, elementwise, linear, loss,
  // optimizer), cuda_conv.cpp (convolution), cuda_norm_pool.cpp (batch norm, pooling).
  Tensor upload_images_impl(const Tensor& host_nhwc, DType compute) override;
  Tensor upload_pixels_impl(const Tensor& host_nhwc_u8, const PixelNorm& norm, DType compute) override;
  Tensor cast_impl(const Tensor& t, DType to) override;
  Tensor zeros_impl(const Shape& shape) override;
  void fill_impl(Tensor& t, float value) override;
  void copy_impl(const Tensor& src, Tensor& dst) override;
  Tensor conv2d_forward_impl(const Tensor& x, const Tensor& w, const ConvParams& p) override;
  Tensor conv2d_forward_bn_stats_impl(const Tensor& x, const Tensor& w, const ConvParams& p,
                                      const BnApply* pro, float eps, BnSaved* stats) override;
  Tensor conv2d_backward_bn_relu_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                      const ConvParams& p, const BnApply& pro,
                                      const BnSaved& saved, Tensor& dw, Tensor& dgamma,
                                      Tensor& dbeta) override;
  Tensor conv2d_backward_data_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                              const ConvParams& p) override;
  void conv2d_backward_weights_impl(const Tensor& x, const Tensor& dy, const ConvParams& p,
                               Tensor& dw) override;
  void conv2d_backward_data_add_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                const ConvParams& p, Tensor& acc) override;
  Tensor batchnorm_forward_train_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 float eps, bool relu, BnSaved& saved) override;
  Tensor batchnorm_forward_infer_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 const Tensor& running_mean, const Tensor& running_var, float eps,
                                 bool relu) override;
  Tensor batchnorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                            const Tensor& beta, const BnSaved& saved, float eps, bool relu,
                            Tensor& dgamma, Tensor& dbeta) override;
  Tensor batchnorm_add_relu_forward_train_impl(const Tensor& x, const Tensor& z, const Tensor& gamma,
                                          const Tensor& beta, float eps, BnSaved& saved) override;
  Tensor batchnorm_add_relu_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                     const Tensor& beta, BnSaved& saved, float eps,
                                     Tensor& dgamma, Tensor& dbeta, Tensor& dz) override;
  void batchnorm_update_running_impl(Tensor& running_mean, Tensor& running_var, const BnSaved& saved,
                                float momentum, int64_t n) override;
  Tensor relu_forward_impl(const Tensor& x) override;
  Tensor relu_backward_impl(const Tensor& dy, const Tensor& y) override;
  Tensor add_forward_impl(const Tensor& a, const Tensor& b, bool relu) override;
  Tensor add_backward_impl(const Tensor& dy, const Tensor& y, bool relu) override;
  Tensor maxpool_forward_impl(const Tensor& x, const PoolParams& p, Tensor& workspace) override;
  Tensor maxpool_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& workspace,
                          const PoolParams& p) override;
  Tensor global_avgpool_forward_impl(const Tensor& x) override;
  Tensor global_avgpool_backward_impl(const Tensor& dy, const Tensor& x) override;
  Tensor linear_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b) override;
  Tensor linear_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw, Tensor& db,
                         bool need_dx) override;
  LossResult softmax_xent_impl(const Tensor& logits, const int32_t* labels, float smoothing,
                          float grad_scale, Tensor* dlogits, const LabelMix* mix) override;
  void softmax_xent_queue_impl(const Tensor& logits, const int32_t* labels, float smoothing,
                          float grad_scale, Tensor* dlogits, const LabelMix* mix) override;
  void sgd_step_impl(Tensor& params, const Tensor& grads, Tensor& momentum,
                const std::vector<SgdSegment>& segments, const SgdHyper& h) override;
  void lars_step_impl(Tensor& params, const Tensor& grads, Tensor& momentum,
                      const std::vector<LarsSegment>& segments, const LarsHyper& h) override;
  bool unscale_and_check_impl(Tensor& grads, float inv_scale) override;
  void unscale_check_queue_impl(Tensor& grads, float inv_scale) override;
  void lerp_impl(Tensor& dst, const Tensor& src, float weight) override;

 private:
  struct ConvEntry;
  struct BnEntry;
  ConvEntry& conv_entry(const Tensor& x, const Tensor& w, const ConvParams& p);
  BnEntry& bn_entry(const Tensor& x);
  // Fused graph `which` (FusionGraph, cuda_entries.h) of a convolution shape, planned at its
  // first use (cuda_fusion.cpp); nullptr where cuDNN refused it or it does not apply (fp32).
  FusedGraph* fusion_graph(ConvEntry& e, int which);
  // Runs graph `which` of `e` through `run`. An accepted graph whose first run fails (an
  // engine that planned but will not execute) is refused from then on and this returns false:
  // the caller runs the separate ops. Later runs, and any run while capturing, throw as usual.
  bool run_fused(ConvEntry& e, int which, const std::function<void()>& run);
  std::vector<std::string> conv_choices() const;  // the parts of kernel_choices()
  std::vector<std::string> bn_choices() const;
  // A new device tensor (NaN-filled when poisoning).
  Tensor alloc(const Shape& shape, DType dt, Layout layout = Layout::plain);
  Tensor alloc_like(const Tensor& x) { return alloc(x.shape(), x.dtype(), x.layout()); }
  // The conv weights `w` (fp32 OIHW) as (O, H, W, I) in `dt`, cached until the weights' version changes.
  const void* weights_as(const Tensor& w, DType dt);
  // The shared cuDNN workspace, grown to at least `bytes`.
  void* workspace(size_t bytes);
  // The per-channel arguments of a cuDNN batch-norm call (see bn_args in cuda_dnn.cpp):
  // forward with `saved` (its statistics are allocated), backward with nullptr.
  struct BnArgs {
    Tensor hg, hb, scratch;
    const float *g = nullptr, *b = nullptr;
    float *rm = nullptr, *rv = nullptr, *dg = nullptr, *db = nullptr;
  };
  BnArgs bn_args(const Tensor& gamma, const Tensor& beta, int64_t c, BnSaved* saved);
  // Copies backward's parameter gradients from the scratch of `a` into dgamma and dbeta.
  void bn_grads_out(const BnArgs& a, int64_t c, Tensor& dgamma, Tensor& dbeta);
  // `t`'s data, or a 16-byte aligned device copy of it when its address is not aligned.
  const float* aligned(const Tensor& t, Tensor& holder);
  // Pinned host scratch of at least `bytes`.
  void* pinned(size_t bytes);
  // Copies `bytes` from pageable `src` through pinned `staging` to device `dst` on the copy
  // stream, chunk by chunk (several host threads on a large batch), so the DMA of one chunk
  // overlaps the host copy of the next.
  void stage_and_copy(const void* src, void* staging, void* dst, size_t bytes);
  // A host NHWC batch (fp32 or 8-bit) copied as it is into device memory on the copy stream,
  // which the compute stream then waits for (upload_images, upload_pixels).
  Tensor copy_batch_up(const Tensor& host);
  cudnnMathType_t conv_math(DType dt) const;
  // Backward-data into `dx` with cuDNN's beta (0: overwrite, 1: add); the algorithm is chosen
  // at a shape's first use. False when this shape runs in fp32 instead (bd_f32).
  bool backward_data_into(const Tensor& dy, const Tensor& w, const Tensor& x, const ConvParams& p,
                          Tensor& dx, float beta);

  BackendOptions opt_;
  std::string name_;
  // The timed kernel choices, remembered per GPU, driver and library versions
  // (BackendOptions::kernel_cache).
  std::unique_ptr<KernelCache> kernel_cache_;
  int device_ = 0;
  cudaStream_t compute_ = nullptr, copy_ = nullptr;
  cudaEvent_t compute_mark_ = nullptr;
  // mark_step_begin / mark_step_backward_done: two pairs of (begin, end), the one being marked,
  // and the one whose end was marked last (-1: none).
  cudaEvent_t span_[2][2] = {{nullptr, nullptr}, {nullptr, nullptr}};
  int span_marking_ = 1, span_done_ = -1;
  // upload_images: a ring of two pinned staging buffers; `copied` marks the end of the last
  // host-to-device copy out of each, so it is refilled only once that copy is done.
  struct Staging {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t copied = nullptr;
    bool pending = false;
  };
  Staging staging_[2];
  int next_staging_ = 0;
  // upload_images from pinned sources: each source stays referenced until the event marking
  // the end of its copy has completed (a caching allocator would otherwise hand its memory to
  // a loader worker mid-DMA). Completed entries are dropped on the next upload and in
  // synchronize(); their events are reused.
  struct PinnedUpload {
    Tensor source;
    cudaEvent_t copied = nullptr;
  };
  std::vector<PinnedUpload> pinned_uploads_;
  std::vector<cudaEvent_t> free_events_;
  // softmax_xent_queue: the per-row results copied to pinned memory (n doubles, then n
  // int64 counts), the event after that copy, and the row count; -1 when nothing is queued.
  Tensor loss_host_;
  cudaEvent_t loss_ready_ = nullptr;
  int64_t loss_rows_ = -1;
  // unscale_check_queue: the verdict on the device (read by sgd_step's skip), its pinned
  // host copy, and the event after that copy.
  Tensor overflow_flag_, overflow_host_;
  cudaEvent_t overflow_ready_ = nullptr;
  // A captured step (cuda_graph.cpp). graph_in_ holds what each replay refills: the scalars
  // (kGraphScalars floats: lr, loss scale / batch, inverse scale), then the labels, then with
  // mixed targets the second labels and the weights; graph_in_host_ is its pinned source and
  // graph_in_copied_ the event after the last refill. graph_refs_ keeps alive what the graph
  // reads or writes that a later call could replace (workspace, loss and flag buffers).
  static constexpr int64_t kGraphScalars = 4;
  bool capturing_ = false;
  cudaGraphExec_t graph_exec_ = nullptr;
  Tensor graph_in_, graph_in_host_, graph_loss_host_;
  cudaEvent_t graph_in_copied_ = nullptr;
  int64_t graph_batch_ = 0, graph_classes_ = 0, graph_rows_ = -1;
  bool graph_mixed_ = false;
  std::vector<Tensor> graph_refs_;
  // Device blocks a pool gave back while the step was recorded (hold_device_frees): the graph
  // may use them, so they are freed when it is dropped (or the recording aborted).
  std::vector<void*> held_frees_;
  // Every tensor made while a step is recorded comes from this backend's own pool, so no
  // tensor outside the graph is ever handed memory the replays write. Made at the first
  // capture; at the backend's end its cache is released and the (empty) allocator left for
  // any tensor of it still alive.
  Allocator* graph_pool_ = nullptr;
  // Every other device tensor of this backend comes from this pool. A caching allocator is
  // safe for the one stream that orders all work on its blocks: a block freed on the host
  // while this stream still uses it is handed out again only to work queued behind that use.
  // Shared with a second backend (another stream), it was not: two backends in one process
  // wrote into each other's live blocks (a test's reference run saw NaN losses on an H200).
  // Made with the backend; at its end emptied and left, caching nothing, to any tensor of it
  // still alive.
  Allocator* pool_ = nullptr;
  const float* graph_scalar(int i) const {
    return capturing_ ? static_cast<const float*>(graph_in_.raw()) + i : nullptr;
  }
  // Profiling marks: events recorded on the compute stream, reused from read to read.
  std::vector<cudaEvent_t> marks_;
  size_t marks_used_ = 0;
  void reap_pinned_uploads();
  cudnnHandle_t dnn_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* blas_workspace_ = nullptr;  // cuBLAS's, set once (see the constructor)
  size_t blas_workspace_bytes_ = 0;
  bool fuse_bn_add_ = true;  // batchnorm_add_relu_* through cuDNN's BN_ADD_ACTIVATION
  // The fused graphs' planning time and its bound (cudnn_graph.h); how many graphs the last
  // line about it (save_kernel_choices) counted.
  PlanBudget plan_budget_;
  int plan_graphs_said_ = 0;
  Tensor workspace_;
  void* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
  std::unordered_map<std::string, std::unique_ptr<ConvEntry>> conv_cache_;
  std::unordered_map<std::string, std::unique_ptr<BnEntry>> bn_cache_;
  struct WeightCopy {
    DType dt;
    Tensor data;
    uint64_t version = 0;  // the weights' Tensor::version() copied
  };
  std::unordered_map<const void*, std::vector<WeightCopy>> weight_copies_;
  // The SGD chunk table on the device, rebuilt when the segments change.
  std::vector<SgdSegment> sgd_segments_;
  Tensor sgd_chunks_;
  int64_t sgd_nchunks_ = 0;
  // The LARS chunk table and its per-chunk squared norms ((chunks, 2) doubles), rebuilt when
  // the segments change.
  std::vector<LarsSegment> lars_segments_;
  Tensor lars_chunks_, lars_partials_;
  int64_t lars_nchunks_ = 0;
};

}  // namespace spotrain::cuda
