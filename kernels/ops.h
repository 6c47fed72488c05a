// The one interface layers call for compute. A Backend (CPU: oneDNN + loops; CUDA: cuDNN,
// cuBLAS and our kernels) implements every op; layers never include a device header.
// Contract for every op: activations may be in any layout the backend chooses (the layout
// tag travels with the Tensor); weights passed in are the canonical fp32 master copies
// (conv OIHW, linear (out, in)); parameter gradients are OVERWRITTEN, input gradients
// are returned as new tensors.
//
// Each op is a public non-virtual function (defined in ops.cpp) that times it when an
// OpProfiler is attached (kernels/op_profiler.h) and calls the backend's protected `*_impl`.
// What is not an op is grouped below the ops: the step's read-backs and synchronization, and
// the optional capabilities a backend may have (captured steps, a device clock).
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device_handles.h"
#include "core/error.h"
#include "core/pixel_norm.h"
#include "core/tensor.h"

namespace spotrain {

class OpProfiler;   // kernels/op_profiler.h
class DeviceClock;  // kernels/op_profiler.h
class KernelCache;  // kernels/kernel_cache.h
class StepCapture;  // kernels/step_capture.h

struct ConvParams {
  int kh = 3, kw = 3, stride = 1, pad = 1;  // groups = 1, dilation = 1, symmetric padding
};

struct PoolParams {
  int k = 3, stride = 2, pad = 1;
};

// What batch-norm training forward leaves for backward.
struct BnSaved {
  Tensor mean;  // (C) fp32 batch mean
  Tensor var;   // (C) fp32 biased batch variance
  // The backend's own (a workspace, saved statistics, the output for a ReLU mask): layers
  // keep these from forward to backward and never read them.
  static constexpr int kSlots = 3;
  Tensor backend_state[kSlots];
  // The slot the composed batchnorm_add_relu_* below keep their output in.
  static constexpr int kComposedOutput = 2;
};

// relu(batchnorm(x)) with given batch statistics: what a convolution applies to its input as
// it reads it under conv + batch-norm fusion (--fusion bn), in place of a batch-norm output
// that is never written.
struct BnApply {
  Tensor gamma, beta;  // (C) fp32 parameters
  Tensor mean, var;    // (C) fp32 batch statistics (a BnSaved's)
  float eps = 1e-5f;
};

// One contiguous run of the flat parameter buffer sharing a weight decay.
struct SgdSegment {
  int64_t offset = 0, count = 0;
  float weight_decay = 0.f;
};

struct SgdHyper {
  float lr = 0.1f, momentum = 0.9f;
  bool nesterov = false;
  float grad_scale = 1.f;  // gradients are multiplied by this first (1/loss scale)
  // Skip the update, on the device, when the verdict of the last unscale_check_queue was
  // overflow: the step is queued before the host knows the verdict.
  bool skip_on_overflow = false;
};

// One run of the flat parameter buffer as LARS (lars_step) sees it: one parameter tensor
// when `adapt` (its step scaled by its own trust ratio, from its own norms), or neighbouring
// tensors left out of the adaptation (batch norm and biases, as the MLPerf reference's
// skip_list: trust 1, and weight decay 0 unless asked for).
struct LarsSegment {
  int64_t offset = 0, count = 0;
  float weight_decay = 0.f;
  bool adapt = false;
};

struct LarsHyper {
  float lr = 0.1f, momentum = 0.9f;
  bool nesterov = false;
  float grad_scale = 1.f;         // as SgdHyper's
  bool skip_on_overflow = false;  // as SgdHyper's
  float trust = 0.001f;    // the trust coefficient eeta
  float epsilon = 1e-7f;   // added to the trust ratio's denominator
};

struct LossResult {
  double loss = 0;       // mean over the batch (without the gradient scale)
  int64_t top1 = 0, top5 = 0;  // correct predictions in the batch
};

// Mixed targets for the loss (mixup / cutmix), on the host: each row's second label and the
// weight of its first.
struct LabelMix {
  const int32_t* labels_b = nullptr;
  const float* lam = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  virtual Allocator& allocator() = 0;
  // Number of compute threads (CPU) or 0.
  virtual int threads() const { return 0; }

  // --- what the device is: the questions code above kernels/ asks instead of the Device -----
  // How this backend computes `compute` (with TF32 math when `tf32`) where it is not what the
  // name says, as a note a run prints once at start ("" when there is nothing to say).
  virtual std::string precision_note(DType compute, bool tf32) const { return ""; }
  // The PCI bus id of the GPU this backend runs on, by which NVML finds it ("" off a GPU).
  virtual std::string gpu_pci_bus_id() const { return ""; }
  // A line on the device and its libraries for the start-up log ("" when name() says it all).
  virtual std::string device_line() const { return ""; }
  // What the backend chose per shape so far (cuDNN's convolution algorithms, its batch-norm
  // configuration, the fp32 fallbacks), one line each, for --profile; empty where there is no
  // choice (the CPU).
  virtual std::vector<std::string> kernel_choices() { return {}; }
  // Writes the kernel choices timed since the last call to the kernel cache
  // (BackendOptions::kernel_cache); nothing to write, or no cache: returns at once. Called
  // after each training step; the CPU times nothing.
  virtual void save_kernel_choices() {}

  // --- data movement (to_host, from_host and the host copies are not timed) -----------------
  // Host NHWC fp32 batch -> the tensor the first layer takes, in the compute dtype.
  Tensor upload_images(const Tensor& host_nhwc, DType compute = DType::f32);
  // Host NHWC 8-bit batch (at most 3 channels) -> the same, normalized on the way (`norm`):
  // a quarter of the fp32 batch's bytes go up, and a GPU normalizes them in one kernel.
  Tensor upload_pixels(const Tensor& host_nhwc_u8, const PixelNorm& norm, DType compute = DType::f32);
  // Host NHWC fp32 tensor -> an activation as this backend passes them between layers (its
  // layout, in `compute`): what an op in the middle of a network receives, where
  // upload_images gives what the first layer takes (on the CPU not the same layout). The op
  // suite feeds every op so. Not timed.
  virtual Tensor upload_activation(const Tensor& host_nhwc, DType compute) {
    return upload_images(host_nhwc, compute);
  }
  // Where the loader should put the host batches upload_images takes: page-locked memory on
  // CUDA (uploaded with one async DMA straight from it, no staging copy), else Allocator::host().
  virtual Allocator& host_staging_allocator() { return Allocator::host(); }
  // Elementwise conversion to another dtype, same shape and layout (fp32 <-> bf16 <-> fp16,
  // round to nearest even; fp16 overflows to inf exactly as on a GPU).
  Tensor cast(const Tensor& t, DType to);
  // Any tensor (any dtype) -> host fp32 in canonical order (4-D: plain NCHW; others: plain).
  virtual Tensor to_host(const Tensor& t) = 0;
  // Host plain tensor -> device tensor of the same shape and layout (copy on every backend).
  virtual Tensor from_host(const Tensor& t) = 0;
  // Copies plain fp32 `src` into `host_dst`, an existing host tensor of as many elements
  // (checkpoint snapshots reuse one warm host buffer instead of faulting in a new one).
  virtual void copy_to_host(const Tensor& src, Tensor& host_dst) {
    Tensor h = to_host(src);
    SPOTRAIN_CHECK(h.numel() == host_dst.numel(), "copy_to_host: size mismatch");
    std::memcpy(host_dst.raw(), h.raw(), size_t(h.numel()) * 4);
  }
  // Starts copying plain fp32 `src` into `host_dst` (as copy_to_host) and returns a function
  // that waits until the copy is done; call it, from any thread, before reading host_dst. On
  // a GPU with host_dst from host_staging_allocator() (pinned), one DMA is queued behind the
  // work so far and nothing waits now; elsewhere the copy is made at once.
  virtual std::function<void()> copy_to_host_async(const Tensor& src, Tensor& host_dst) {
    copy_to_host(src, host_dst);
    return [] {};
  }
  // A zero-filled plain fp32 tensor on this device.
  Tensor zeros(const Shape& shape);
  void fill(Tensor& t, float value);
  // dst = src (same shape, device; plain fp32).
  void copy(const Tensor& src, Tensor& dst);

  // --- convolution ---------------------------------------------------------------------
  Tensor conv2d_forward(const Tensor& x, const Tensor& w, const ConvParams& p);
  Tensor conv2d_backward_data(const Tensor& dy, const Tensor& w, const Tensor& x, const ConvParams& p);
  void conv2d_backward_weights(const Tensor& x, const Tensor& dy, const ConvParams& p, Tensor& dw);
  // acc += conv2d_backward_data(dy, w, x, p): the input gradient added to a gradient that
  // already reaches x by another path (a residual block's shortcut), in one pass where the
  // backend can (cuDNN's beta = 1). acc has x's shape and dtype and belongs to the caller.
  void conv2d_backward_data_add(const Tensor& dy, const Tensor& w, const Tensor& x,
                                const ConvParams& p, Tensor& acc);

  // Conv + batch-norm fusion (--fusion bn): y = conv2d_forward(in, w, p), where `in` is x, or
  // relu(batchnorm(x)) with `pro`'s statistics (the previous batch norm and its ReLU applied
  // as x is read); with `stats`, also the batch statistics of y for the batch norm that follows
  // (eps is its epsilon): stats->mean, var and whatever batchnorm_backward(relu = false) and
  // batchnorm_update_running need, as if batchnorm_forward_train had run on y. One cuDNN graph
  // where cuDNN takes the shape (statistics made as y is written); the default composes the ops.
  Tensor conv2d_forward_bn_stats(const Tensor& x, const Tensor& w, const ConvParams& p,
                                 const BnApply* pro, float eps, BnSaved* stats);
  // Backward of conv2d_forward_bn_stats with a prologue, through the convolution and the
  // prologue's batch norm and ReLU at once: writes the convolution's dw and the batch norm's
  // dgamma and dbeta (its statistics in `saved`, as the op that made them left them; `pro`
  // holds the same mean and var) and returns the gradient of x, the batch norm's input. The
  // default makes relu(batchnorm(x)) again and composes the ops.
  Tensor conv2d_backward_bn_relu(const Tensor& dy, const Tensor& w, const Tensor& x,
                                 const ConvParams& p, const BnApply& pro, const BnSaved& saved,
                                 Tensor& dw, Tensor& dgamma, Tensor& dbeta);

  // --- batch norm (statistics over N, H, W per channel; optional fused ReLU) ------------
  Tensor batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 float eps, bool relu, BnSaved& saved);
  Tensor batchnorm_forward_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 const Tensor& running_mean, const Tensor& running_var, float eps,
                                 bool relu);
  Tensor batchnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                            const Tensor& beta, const BnSaved& saved, float eps, bool relu,
                            Tensor& dgamma, Tensor& dbeta);
  // relu(batchnorm(x) + z) for training: a residual block's last BN with its Add and ReLU,
  // in one op where the backend has one (cuDNN's BN_ADD_ACTIVATION). The default composes
  // batchnorm_forward_train and add_forward. The result (the ReLU mask) is kept
  // in saved.backend_state[BnSaved::kComposedOutput].
  Tensor batchnorm_add_relu_forward_train(const Tensor& x, const Tensor& z, const Tensor& gamma,
                                          const Tensor& beta, float eps, BnSaved& saved);
  // Its backward: returns dx, writes dgamma and dbeta, and sets dz to the gradient of z. It
  // consumes `saved` (the forward's, which nothing reads after this backward): the composed
  // form releases the saved output once the ReLU's mask is applied, so that it is not alive
  // beside dy, dz and dx at the peak of a checkpointed replay's backward.
  Tensor batchnorm_add_relu_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                     const Tensor& beta, BnSaved& saved, float eps,
                                     Tensor& dgamma, Tensor& dbeta, Tensor& dz);
  // running = (1 - momentum) * running + momentum * batch (variance made unbiased with n).
  void batchnorm_update_running(Tensor& running_mean, Tensor& running_var, const BnSaved& saved,
                                float momentum, int64_t n);

  // Activation ops (convolution, batch norm, pooling, ReLU, Add) take and return tensors in
  // the compute dtype (fp32, bf16 or fp16); weight gradients, BN parameters and statistics,
  // the pooled features, Linear and the loss stay fp32.

  // --- elementwise -----------------------------------------------------------------------
  Tensor relu_forward(const Tensor& x);
  Tensor relu_backward(const Tensor& dy, const Tensor& y);
  // y = a + b, then ReLU when relu is set (a and b of the same shape and layout).
  Tensor add_forward(const Tensor& a, const Tensor& b, bool relu);
  // Gradient through the optional ReLU of add_forward (y is its output); equals dy otherwise.
  Tensor add_backward(const Tensor& dy, const Tensor& y, bool relu);

  // --- pooling -----------------------------------------------------------------------------
  Tensor maxpool_forward(const Tensor& x, const PoolParams& p, Tensor& workspace);
  Tensor maxpool_backward(const Tensor& dy, const Tensor& x, const Tensor& workspace,
                          const PoolParams& p);
  // (N, C, H, W) any dtype -> (N, C) plain fp32; backward returns x's dtype and layout.
  Tensor global_avgpool_forward(const Tensor& x);
  Tensor global_avgpool_backward(const Tensor& dy, const Tensor& x);

  // --- linear: y (N, M) = x (N, K) w^T (M, K) + b (M) -----------------------------------------
  Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& b);
  Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw, Tensor& db,
                         bool need_dx);

  // --- loss ----------------------------------------------------------------------------------
  // Mean softmax cross-entropy with label smoothing over logits (N, M) plain; labels on the
  // host. When dlogits is non-null it receives d(loss * grad_scale)/d(logits). With `mix`
  // (mixup / cutmix), row i's loss is lam[i] * CE(labels[i]) + (1 - lam[i]) * CE(labels_b[i]);
  // top-1/top-5 count labels[i].
  LossResult softmax_xent(const Tensor& logits, const int32_t* labels, float smoothing,
                          float grad_scale, Tensor* dlogits, const LabelMix* mix = nullptr);
  // softmax_xent without waiting for its figures: queues the loss (and dlogits) and the copy
  // of its per-row results; queued_loss() (below) waits for them. The training step asks for
  // the loss only once backward is queued, so a GPU never idles mid-step for the host to read
  // it. The default computes at once.
  void softmax_xent_queue(const Tensor& logits, const int32_t* labels, float smoothing,
                          float grad_scale, Tensor* dlogits, const LabelMix* mix = nullptr);

  // --- optimizer ---------------------------------------------------------------------------
  // SGD with momentum (PyTorch semantics) over flat fp32 buffers, segment by segment.
  // Marks params written (Tensor::mark_written), as copy and fill mark dst and t.
  void sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum,
                const std::vector<SgdSegment>& segments, const SgdHyper& h);
  // LARS with momentum (kernels/elementwise.h: lars_update, the MLPerf reference's form) over
  // the same flat buffers: each adapted segment's trust ratio from the norms of its weights and
  // gradients, computed on the device (no read-back, so a captured step replays it; its
  // learning rate then comes from device memory as sgd_step's). The momentum buffer holds the
  // learning rate inside (v = momentum * v + lr * trust * g), unlike sgd_step's. Marks params
  // written.
  void lars_step(Tensor& params, const Tensor& grads, Tensor& momentum,
                 const std::vector<LarsSegment>& segments, const LarsHyper& h);
  // Multiplies the flat gradients by inv_scale in place and reports whether any element is
  // inf or NaN: the one overflow verdict for the whole model (fp16 loss scaling).
  bool unscale_and_check(Tensor& grads, float inv_scale);
  // unscale_and_check without waiting for the verdict: it stays on the device, where
  // sgd_step(skip_on_overflow) reads it, and its copy to the host is queued; queued_overflow()
  // (below) waits for that copy. The default decides at once.
  void unscale_check_queue(Tensor& grads, float inv_scale);
  // dst += weight * (src - dst) over fp32 tensors of one size: the moving average of the
  // weights (--ema-decay). Marks dst written.
  void lerp(Tensor& dst, const Tensor& src, float weight);

  // --- the step around the ops: read-backs and the device's queue (not ops, not timed) ------
  // The figures of the last softmax_xent_queue / the verdict of the last unscale_check_queue,
  // waiting for them.
  virtual LossResult queued_loss() { return queued_loss_; }
  virtual bool queued_overflow() { return queued_overflow_; }
  virtual void synchronize() {}
  // A rank's own compute on a device that runs ahead of the host (observe/rank_watch.h): marks
  // on the compute stream before a step's forward and after its backward (the all-reduce waits
  // for other ranks on a stream of its own, so the span holds no such wait). Two pairs
  // alternate, so a step's span is read while the next is queued. step_span_seconds(): the
  // span of the step last marked done, waiting for its end; -1 where the backend marks nothing
  // (the CPU, whose host clock sees its compute already).
  virtual void mark_step_begin() {}
  virtual void mark_step_backward_done() {}
  virtual double step_span_seconds() { return -1; }
  // Whether ops are queued to run later (a GPU's stream) rather than computed before they
  // return (the CPU): whether waiting to read a step's figures gains anything.
  virtual bool queues_ops() const { return false; }
  // The device queue every op goes on, so a device communicator can order its work after the
  // backend's (core/device_handles.h); nullptr where ops run at once (the CPU).
  virtual DeviceStream* stream() { return nullptr; }

  // --- capabilities a backend may have (nullptr: it has not) ---------------------------------
  // Recording a step once and replaying it (CUDA Graphs, --cuda-graph).
  virtual StepCapture* capture() { return nullptr; }
  // Whether upload_pixels normalizes on the device, so that 8-bit batches save the loader's
  // writes and the upload three quarters of their bytes (a GPU); else (the default) the host
  // would normalize them on the training thread, and the loader's threads had better.
  virtual bool normalizes_pixels() const { return false; }
  // Whether conv2d_forward_bn_stats and conv2d_backward_bn_relu run as fused kernels at this
  // compute dtype, rather than composed of the separate ops (the default): where timing the
  // fusion can find a win (--fusion auto).
  virtual bool fuses_conv_bn(DType compute) const { return false; }
  // Whether a convolution reading a batch norm + ReLU's output (not fused) has that output
  // made again in its backward, from the batch norm's own stash (batchnorm_forward_infer with
  // the batch statistics), rather than keeping it from forward to backward: one activation
  // less per such convolution for one elementwise pass (the CPU, where memory is the limit).
  virtual bool remakes_bn_relu_inputs() const { return false; }
  // A clock on the device that marks points in its queue, for OpProfiler (the CPU runs its ops
  // as they are called: the host clock serves).
  virtual DeviceClock* device_clock() { return nullptr; }
  // The kernel cache the backend keeps its timed choices in (kernels/kernel_cache.h), where
  // the engine keeps the verdicts of its own timing too (--fusion auto's); nullptr where
  // nothing is timed (the CPU).
  virtual KernelCache* kernel_cache() { return nullptr; }
  // Whether kernels chosen from now on are taken untimed because the run's budget for timing
  // them is spent (the CUDA backend's fused graphs past PlanBudget): a restart, with a budget
  // of its own, times them and may run others, so what is measured on them now is not to be
  // kept for it. false where nothing is timed (the CPU), or nothing is cut.
  virtual bool kernel_timing_cut() const { return false; }

  // Times every op from now on (nullptr: stop); the profiler must outlive its attachment.
  void set_profiler(OpProfiler* p) { profiler_ = p; }
  OpProfiler* profiler() const { return profiler_; }

  // What upload_pixels takes: a host 8-bit NHWC batch of 1 to 3 channels, made into fp32,
  // bf16 or fp16 (throws Error).
  static void check_pixel_batch(const Tensor& host_nhwc_u8, DType compute);

 protected:
  // The ops, as each backend implements them (see the public functions above).
  virtual Tensor upload_images_impl(const Tensor& host_nhwc, DType compute) = 0;
  // Default: normalizes on the host, then upload_images_impl.
  virtual Tensor upload_pixels_impl(const Tensor& host_nhwc_u8, const PixelNorm& norm, DType compute);
  virtual Tensor cast_impl(const Tensor& t, DType to) = 0;
  virtual Tensor zeros_impl(const Shape& shape) = 0;
  virtual void fill_impl(Tensor& t, float value) = 0;
  virtual void copy_impl(const Tensor& src, Tensor& dst) = 0;
  virtual Tensor conv2d_forward_impl(const Tensor& x, const Tensor& w, const ConvParams& p) = 0;
  virtual Tensor conv2d_backward_data_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                           const ConvParams& p) = 0;
  virtual void conv2d_backward_weights_impl(const Tensor& x, const Tensor& dy, const ConvParams& p,
                                            Tensor& dw) = 0;
  virtual void conv2d_backward_data_add_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                             const ConvParams& p, Tensor& acc);
  virtual Tensor conv2d_forward_bn_stats_impl(const Tensor& x, const Tensor& w,
                                              const ConvParams& p, const BnApply* pro, float eps,
                                              BnSaved* stats);
  virtual Tensor conv2d_backward_bn_relu_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                              const ConvParams& p, const BnApply& pro,
                                              const BnSaved& saved, Tensor& dw, Tensor& dgamma,
                                              Tensor& dbeta);
  virtual Tensor batchnorm_forward_train_impl(const Tensor& x, const Tensor& gamma,
                                              const Tensor& beta, float eps, bool relu,
                                              BnSaved& saved) = 0;
  virtual Tensor batchnorm_forward_infer_impl(const Tensor& x, const Tensor& gamma,
                                              const Tensor& beta, const Tensor& running_mean,
                                              const Tensor& running_var, float eps, bool relu) = 0;
  virtual Tensor batchnorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                         const Tensor& beta, const BnSaved& saved, float eps,
                                         bool relu, Tensor& dgamma, Tensor& dbeta) = 0;
  virtual Tensor batchnorm_add_relu_forward_train_impl(const Tensor& x, const Tensor& z,
                                                       const Tensor& gamma, const Tensor& beta,
                                                       float eps, BnSaved& saved);
  virtual Tensor batchnorm_add_relu_backward_impl(const Tensor& dy, const Tensor& x,
                                                  const Tensor& gamma, const Tensor& beta,
                                                  BnSaved& saved, float eps, Tensor& dgamma,
                                                  Tensor& dbeta, Tensor& dz);
  virtual void batchnorm_update_running_impl(Tensor& running_mean, Tensor& running_var,
                                             const BnSaved& saved, float momentum, int64_t n) = 0;
  virtual Tensor relu_forward_impl(const Tensor& x) = 0;
  virtual Tensor relu_backward_impl(const Tensor& dy, const Tensor& y) = 0;
  virtual Tensor add_forward_impl(const Tensor& a, const Tensor& b, bool relu) = 0;
  virtual Tensor add_backward_impl(const Tensor& dy, const Tensor& y, bool relu) = 0;
  virtual Tensor maxpool_forward_impl(const Tensor& x, const PoolParams& p, Tensor& workspace) = 0;
  virtual Tensor maxpool_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& workspace,
                                       const PoolParams& p) = 0;
  virtual Tensor global_avgpool_forward_impl(const Tensor& x) = 0;
  virtual Tensor global_avgpool_backward_impl(const Tensor& dy, const Tensor& x) = 0;
  virtual Tensor linear_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b) = 0;
  virtual Tensor linear_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw,
                                      Tensor& db, bool need_dx) = 0;
  virtual LossResult softmax_xent_impl(const Tensor& logits, const int32_t* labels, float smoothing,
                                       float grad_scale, Tensor* dlogits, const LabelMix* mix) = 0;
  virtual void softmax_xent_queue_impl(const Tensor& logits, const int32_t* labels, float smoothing,
                                       float grad_scale, Tensor* dlogits, const LabelMix* mix);
  virtual void sgd_step_impl(Tensor& params, const Tensor& grads, Tensor& momentum,
                             const std::vector<SgdSegment>& segments, const SgdHyper& h) = 0;
  virtual void lars_step_impl(Tensor& params, const Tensor& grads, Tensor& momentum,
                              const std::vector<LarsSegment>& segments, const LarsHyper& h) = 0;
  virtual bool unscale_and_check_impl(Tensor& grads, float inv_scale) = 0;
  virtual void unscale_check_queue_impl(Tensor& grads, float inv_scale);
  virtual void lerp_impl(Tensor& dst, const Tensor& src, float weight) = 0;

  // The fused ops composed of the others: what their *_impl defaults run, and what a backend
  // calls where it cannot fuse a shape or dtype. A backend's fallback calls these (or its own
  // helpers), never the public op it implements: that would run its *_impl again, without
  // end (a GPU run once crashed so). As a net under that rule, public ops nested more than
  // kMaxOpDepth deep throw Error instead of overflowing the stack.
  void composed_conv2d_backward_data_add(const Tensor& dy, const Tensor& w, const Tensor& x,
                                         const ConvParams& p, Tensor& acc);
  Tensor composed_conv2d_forward_bn_stats(const Tensor& x, const Tensor& w, const ConvParams& p,
                                          const BnApply* pro, float eps, BnSaved* stats);
  Tensor composed_conv2d_backward_bn_relu(const Tensor& dy, const Tensor& w, const Tensor& x,
                                          const ConvParams& p, const BnApply& pro,
                                          const BnSaved& saved, Tensor& dw, Tensor& dgamma,
                                          Tensor& dbeta);
  Tensor composed_batchnorm_add_relu_forward_train(const Tensor& x, const Tensor& z,
                                                   const Tensor& gamma, const Tensor& beta,
                                                   float eps, BnSaved& saved);
  Tensor composed_batchnorm_add_relu_backward(const Tensor& dy, const Tensor& x,
                                              const Tensor& gamma, const Tensor& beta,
                                              BnSaved& saved, float eps, Tensor& dgamma,
                                              Tensor& dbeta, Tensor& dz);
  static constexpr int kMaxOpDepth = 32;

  // The public op running now, as the op profiler names it ("bn_relu+conv2d_forward+stats"),
  // the outermost where ops nest; "" between ops. A backend that wraps another (the planted
  // wrong op of kernels/wrong_op_backend.h) reads it in its *_impl.
  const char* running_op() const { return running_op_; }

  LossResult queued_loss_;  // softmax_xent_queue's result where it computes at once
  bool queued_overflow_ = false;  // unscale_check_queue's verdict where it decides at once

 private:
  // Runs `run` as op `op`, timed when a profiler is attached (an op composed of others counts
  // once, as the op that was called); `shape` describes its arguments for the report.
  template <class Run, class Shape>
  auto timed(const char* op, Shape&& shape, Run&& run) -> decltype(run());
  OpProfiler* profiler_ = nullptr;
  int op_depth_ = 0;  // public ops running now (composed ops call others)
  const char* running_op_ = "";  // running_op()
};

struct BackendOptions {
  int threads = 0;  // 0: all cores
  bool deterministic = false;
  // GPU: fp32 convolutions and Linear may use TF32 tensor cores (--precision tf32).
  bool tf32 = false;
  // GPU, testing: fill every newly allocated output with NaN bytes so an element an op
  // fails to write shows up.
  bool poison = false;
  // CPU: the layout activations keep between layers: Layout::blocked (oneDNN's nChw16c or
  // nChw8c, its fast one) or Layout::nhwc (the GPU's; the op suite runs the CPU in it against
  // the blocked CPU, so the suite's own logic meets a second layout on every commit).
  Layout cpu_activations = Layout::blocked;  // preferred_cpu_activations says which for a run
  // GPU: time the candidates of each convolution direction and fused graph at their first
  // use on the real shape and keep the fastest (--autotune); false takes cuDNN's heuristics'
  // first choice (--no-autotune). --deterministic always takes the heuristics'.
  bool autotune = true;
  // GPU: the file the timed choices are remembered in (kernels/kernel_cache.h; "" = none),
  // so a restarted job runs its chosen kernels from the first step.
  std::string kernel_cache = "";
};

// The CPU backend's faster activation layout on this processor for a compute dtype: NHWC
// for bf16 where oneDNN has AMX (its AMX kernels take no other), else blocked.
Layout preferred_cpu_activations(DType compute);

// Creates the backend for "cpu", "cuda" or "auto" (cuda when built with it and a GPU is
// present, else cpu). Throws Error for "cuda" when unavailable.
std::unique_ptr<Backend> make_backend(const std::string& device, const BackendOptions& opt);

// An 8-bit NHWC host batch normalized on the host into fp32 (what upload_pixels computes on a
// device): fma(pixel, norm.scale(c), norm.shift(c)) per channel.
Tensor normalize_pixels_on_host(const Tensor& host_nhwc_u8, const PixelNorm& norm);
// Whether this build has the CUDA backend and a CUDA device is present (what "auto" picks).
bool cuda_backend_ready();

}  // namespace spotrain
