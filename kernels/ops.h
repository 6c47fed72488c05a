// The one interface layers call for compute. A Backend (CPU: oneDNN + loops; CUDA: cuDNN,
// cuBLAS and our kernels) implements every op; layers never include a device header.
// Contract for every op: activations may be in any layout the backend chooses (the layout
// tag travels with the Tensor); weights passed in are the canonical fp32 master copies
// (conv OIHW, linear (out, in)); parameter gradients are OVERWRITTEN, input gradients
// are returned as new tensors.
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace spotrain {

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

// One training step's values that a captured step (Backend::begin_capture) reads from device
// memory, refilled before each replay.
struct StepInputs {
  const int32_t* labels = nullptr;  // n labels, on the host
  const LabelMix* mix = nullptr;    // null: plain labels
  int64_t n = 0;
  float lr = 0;           // sgd_step's learning rate
  float loss_scale = 1;   // softmax_xent's grad_scale
  float inv_scale = 1;    // unscale_check_queue's inv_scale
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  virtual Allocator& allocator() = 0;
  // Number of compute threads (CPU) or 0.
  virtual int threads() const { return 0; }

  // --- data movement -------------------------------------------------------------------
  // Host NHWC fp32 batch -> the tensor the first layer takes, in the compute dtype.
  virtual Tensor upload_images(const Tensor& host_nhwc, DType compute = DType::f32) = 0;
  // Where the loader should put the host batches upload_images takes: page-locked memory on
  // CUDA (uploaded with one async DMA straight from it, no staging copy), else Allocator::host().
  virtual Allocator& host_staging_allocator() { return Allocator::host(); }
  // Elementwise conversion to another dtype, same shape and layout (fp32 <-> bf16 <-> fp16,
  // round to nearest even; fp16 overflows to inf exactly as on a GPU).
  virtual Tensor cast(const Tensor& t, DType to) = 0;
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
  virtual Tensor zeros(const Shape& shape) = 0;
  virtual void fill(Tensor& t, float value) = 0;
  // dst = src (same shape, device; plain fp32).
  virtual void copy(const Tensor& src, Tensor& dst) = 0;

  // --- convolution ---------------------------------------------------------------------
  virtual Tensor conv2d_forward(const Tensor& x, const Tensor& w, const ConvParams& p) = 0;
  virtual Tensor conv2d_backward_data(const Tensor& dy, const Tensor& w, const Tensor& x,
                                      const ConvParams& p) = 0;
  virtual void conv2d_backward_weights(const Tensor& x, const Tensor& dy, const ConvParams& p,
                                       Tensor& dw) = 0;
  // acc += conv2d_backward_data(dy, w, x, p): the input gradient added to a gradient that
  // already reaches x by another path (a residual block's shortcut), in one pass where the
  // backend can (cuDNN's beta = 1). acc has x's shape and dtype and belongs to the caller.
  virtual void conv2d_backward_data_add(const Tensor& dy, const Tensor& w, const Tensor& x,
                                        const ConvParams& p, Tensor& acc) {
    acc = add_forward(conv2d_backward_data(dy, w, x, p), acc, false);
  }

  // --- batch norm (statistics over N, H, W per channel; optional fused ReLU) ------------
  virtual Tensor batchnorm_forward_train(const Tensor& x, const Tensor& gamma,
                                         const Tensor& beta, float eps, bool relu,
                                         BnSaved& saved) = 0;
  virtual Tensor batchnorm_forward_infer(const Tensor& x, const Tensor& gamma,
                                         const Tensor& beta, const Tensor& running_mean,
                                         const Tensor& running_var, float eps, bool relu) = 0;
  virtual Tensor batchnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                    const Tensor& beta, const BnSaved& saved, float eps,
                                    bool relu, Tensor& dgamma, Tensor& dbeta) = 0;
  // relu(batchnorm(x) + z) for training: a residual block's last BN with its Add and ReLU,
  // in one op where the backend has one (cuDNN's BN_ADD_ACTIVATION). The default composes
  // batchnorm_forward_train and add_forward. The result (the ReLU mask) is kept
  // in saved.backend_state[BnSaved::kComposedOutput].
  virtual Tensor batchnorm_add_relu_forward_train(const Tensor& x, const Tensor& z,
                                                  const Tensor& gamma, const Tensor& beta,
                                                  float eps, BnSaved& saved) {
    Tensor y = add_forward(batchnorm_forward_train(x, gamma, beta, eps, false, saved), z, true);
    saved.backend_state[BnSaved::kComposedOutput] = y;
    return y;
  }
  // Its backward: returns dx, writes dgamma and dbeta, and sets dz to the gradient of z.
  virtual Tensor batchnorm_add_relu_backward(const Tensor& dy, const Tensor& x,
                                             const Tensor& gamma, const Tensor& beta,
                                             const BnSaved& saved, float eps, Tensor& dgamma,
                                             Tensor& dbeta, Tensor& dz) {
    dz = add_backward(dy, saved.backend_state[BnSaved::kComposedOutput], true);
    return batchnorm_backward(dz, x, gamma, beta, saved, eps, false, dgamma, dbeta);
  }
  // running = (1 - momentum) * running + momentum * batch (variance made unbiased with n).
  virtual void batchnorm_update_running(Tensor& running_mean, Tensor& running_var,
                                        const BnSaved& saved, float momentum, int64_t n) = 0;

  // Activation ops (convolution, batch norm, pooling, ReLU, Add) take and return tensors in
  // the compute dtype (fp32, bf16 or fp16); weight gradients, BN parameters and statistics,
  // the pooled features, Linear and the loss stay fp32.

  // --- elementwise -----------------------------------------------------------------------
  virtual Tensor relu_forward(const Tensor& x) = 0;
  virtual Tensor relu_backward(const Tensor& dy, const Tensor& y) = 0;
  // y = a + b, then ReLU when relu is set (a and b of the same shape and layout).
  virtual Tensor add_forward(const Tensor& a, const Tensor& b, bool relu) = 0;
  // Gradient through the optional ReLU of add_forward (y is its output); equals dy otherwise.
  virtual Tensor add_backward(const Tensor& dy, const Tensor& y, bool relu) = 0;

  // --- pooling -----------------------------------------------------------------------------
  virtual Tensor maxpool_forward(const Tensor& x, const PoolParams& p, Tensor& workspace) = 0;
  virtual Tensor maxpool_backward(const Tensor& dy, const Tensor& x, const Tensor& workspace,
                                  const PoolParams& p) = 0;
  // (N, C, H, W) any dtype -> (N, C) plain fp32; backward returns x's dtype and layout.
  virtual Tensor global_avgpool_forward(const Tensor& x) = 0;
  virtual Tensor global_avgpool_backward(const Tensor& dy, const Tensor& x) = 0;

  // --- linear: y (N, M) = x (N, K) w^T (M, K) + b (M) -----------------------------------------
  virtual Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& b) = 0;
  virtual Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw,
                                 Tensor& db, bool need_dx) = 0;

  // --- loss ----------------------------------------------------------------------------------
  // Mean softmax cross-entropy with label smoothing over logits (N, M) plain; labels on the
  // host. When dlogits is non-null it receives d(loss * grad_scale)/d(logits). With `mix`
  // (mixup / cutmix), row i's loss is lam[i] * CE(labels[i]) + (1 - lam[i]) * CE(labels_b[i]);
  // top-1/top-5 count labels[i].
  virtual LossResult softmax_xent(const Tensor& logits, const int32_t* labels, float smoothing,
                                  float grad_scale, Tensor* dlogits, const LabelMix* mix = nullptr) = 0;

  // softmax_xent without waiting for its figures: queues the loss (and dlogits) and the copy
  // of its per-row results; queued_loss() waits for them. The training step asks for the
  // loss only once backward is queued, so a GPU never idles mid-step for the host to read
  // it. The default computes at once.
  virtual void softmax_xent_queue(const Tensor& logits, const int32_t* labels, float smoothing,
                                  float grad_scale, Tensor* dlogits, const LabelMix* mix = nullptr) {
    queued_loss_ = softmax_xent(logits, labels, smoothing, grad_scale, dlogits, mix);
  }
  virtual LossResult queued_loss() { return queued_loss_; }

  // --- optimizer ---------------------------------------------------------------------------
  // SGD with momentum (PyTorch semantics) over flat fp32 buffers, segment by segment.
  // Marks params written (Tensor::mark_written), as copy and fill mark dst and t.
  virtual void sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum,
                        const std::vector<SgdSegment>& segments, const SgdHyper& h) = 0;
  // Multiplies the flat gradients by inv_scale in place and reports whether any element is
  // inf or NaN: the one overflow verdict for the whole model (fp16 loss scaling).
  virtual bool unscale_and_check(Tensor& grads, float inv_scale) = 0;
  // unscale_and_check without waiting for the verdict: it stays on the device, where
  // sgd_step(skip_on_overflow) reads it, and its copy to the host is queued; queued_overflow()
  // waits for that copy. The default decides at once.
  virtual void unscale_check_queue(Tensor& grads, float inv_scale) {
    queued_overflow_ = unscale_and_check(grads, inv_scale);
  }
  virtual bool queued_overflow() { return queued_overflow_; }
  // dst += weight * (src - dst) over fp32 tensors of one size: the moving average of the
  // weights (--ema-decay). Marks dst written.
  virtual void lerp(Tensor& dst, const Tensor& src, float weight) = 0;
  virtual void synchronize() {}
  // Whether ops are queued to run later (a GPU's stream) rather than computed before they
  // return (the CPU): whether waiting to read a step's figures gains anything.
  virtual bool queues_ops() const { return false; }
  // GPU: the compute stream (a cudaStream_t) every op is queued on, so a device communicator
  // can order its work after the backend's with an event; nullptr on the CPU.
  virtual void* native_stream() { return nullptr; }

  // --- captured steps (CUDA Graphs, --cuda-graph) ------------------------------------------
  // Where can_capture(), the device work of one training step is recorded once, between
  // begin_capture and end_capture (recording runs nothing), then queued by replay_capture
  // with one launch. While recording, softmax_xent_queue, sgd_step and unscale_check_queue
  // take their labels (and mixed targets), learning rate and scales from device memory that
  // each replay first refills from its StepInputs; every other argument, shape and buffer is
  // replayed as recorded. abort_capture ends a recording that an error cut short;
  // drop_capture frees a recorded step.
  virtual bool can_capture() const { return false; }
  virtual void begin_capture(int64_t /*batch*/, bool /*mixed*/) {
    throw Error(str("the ", name(), " backend cannot capture steps (--cuda-graph needs a GPU)"));
  }
  virtual void end_capture() {}
  virtual void abort_capture() {}
  virtual void replay_capture(const StepInputs& /*in*/) {
    throw Error(str("the ", name(), " backend has no captured step to replay"));
  }
  virtual void drop_capture() {}
  // Device memory held for the captured step's own tensors (0 when none is captured).
  virtual size_t capture_reserved_bytes() { return 0; }

  // --- profiling (ProfiledBackend) ------------------------------------------------------------
  // Records a timing mark behind the work queued so far (GPU: an event on the compute stream)
  // and returns its index since the last read, or -1 when the backend has no device clock
  // (the CPU runs its ops synchronously: the host clock serves).
  virtual int record_mark() { return -1; }
  // Waits for the marks recorded since the last call and returns each one's time in ms after
  // the first; forgets them.
  virtual std::vector<double> read_marks_ms() { return {}; }

 protected:
  LossResult queued_loss_;  // softmax_xent_queue's result where it computes at once
  bool queued_overflow_ = false;  // unscale_check_queue's verdict where it decides at once
};

struct BackendOptions {
  int threads = 0;  // 0: all cores
  bool deterministic = false;
  // GPU: fp32 convolutions and Linear may use TF32 tensor cores (--precision tf32).
  bool tf32 = false;
  // GPU, testing: fill every newly allocated output with NaN bytes so an element an op
  // fails to write shows up.
  bool poison = false;
};

// Creates the backend for "cpu", "cuda" or "auto" (cuda when built with it and a GPU is
// present, else cpu). Throws Error for "cuda" when unavailable.
std::unique_ptr<Backend> make_backend(const std::string& device, const BackendOptions& opt);
// Whether this build has the CUDA backend and a CUDA device is present (what "auto" picks).
bool cuda_backend_ready();

}  // namespace spotrain
