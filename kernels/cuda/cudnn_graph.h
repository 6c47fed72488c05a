// cuDNN's graph (backend) API: descriptors owned by RAII, and the first fused graphs of conv +
// batch-norm fusion: a convolution whose epilogue also writes the per-channel sum and sum of
// squares of its output (what the following batch norm's statistics need), in one pass
// instead of a second read of the output, optionally with a prologue applying the previous
// batch norm's scale, bias and ReLU as the input is read. Planned once per shape; where cuDNN has no engine
// for the graph (shape, dtype or GPU; its documentation takes fp16 only for GenStats), the
// plan says so and why. Internal to kernels/cuda/.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/cudnn_api.h"

namespace spotrain::cuda {

// One backend descriptor of cuDNN's graph API, destroyed with its owner (move-only).
class BackendDesc {
 public:
  BackendDesc() = default;
  explicit BackendDesc(cudnnBackendDescriptorType_t type);
  BackendDesc(BackendDesc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  BackendDesc& operator=(BackendDesc&& o) noexcept;
  BackendDesc(const BackendDesc&) = delete;
  BackendDesc& operator=(const BackendDesc&) = delete;
  ~BackendDesc();
  cudnnBackendDescriptor_t get() const { return d_; }
  // Sets an attribute of `n` values (throws Error on a refusal: a malformed graph is a bug).
  BackendDesc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                   int64_t n, const void* values);
  BackendDesc& set(cudnnBackendAttributeName_t name, const BackendDesc& d);
  BackendDesc& set(cudnnBackendAttributeName_t name, int64_t v);
  // cuDNN's verdict; NOT_SUPPORTED and friends are answers, not errors.
  cudnnStatus_t finalize();

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// An NHWC convolution: input n x c x h x w, k filters of r x s, square stride and padding.
struct ConvShape {
  DType dtype = DType::f16;
  int64_t n = 0, c = 0, h = 0, w = 0, k = 0, r = 0, s = 0, stride = 1, pad = 0;
  int64_t p() const { return (h + 2 * pad - r) / stride + 1; }  // output height
  int64_t q() const { return (w + 2 * pad - s) / stride + 1; }  // output width
};

// y = conv(x, w) and, per output channel, sum(y) and sum(y^2) in fp32, in one graph. With
// the prologue the convolution reads relu(x * scale + bias) (scale and bias per input channel,
// in x's dtype): the previous batch norm and its ReLU applied as x is read, never written.
class ConvStatsGraph {
 public:
  ConvStatsGraph(cudnnHandle_t handle, const ConvShape& shape, bool bn_relu_prologue = false);
  bool accepted() const { return accepted_; }
  // The dtype of the prologue's intermediates cuDNN took ("fp32", or the 16-bit type).
  const std::string& intermediates() const { return intermediates_; }
  // Why cuDNN refused the graph ("" when accepted).
  const std::string& refusal() const { return refusal_; }
  size_t workspace_bytes() const { return workspace_; }
  int engines_tried() const { return tried_; }
  // x: NHWC, w: KRSC (NHWC filters), y: NHWC, all in shape.dtype; sum, sqsum: k floats each;
  // scale, bias: c values in shape.dtype (the prologue only). Queued on the handle's stream.
  void run(const void* x, const void* w, void* y, float* sum, float* sqsum, void* workspace,
           const void* scale = nullptr, const void* bias = nullptr) const;

 private:
  void plan(const ConvShape& sh, cudnnDataType_t intermediates);
  bool finalized(BackendDesc& d, const char* what);

  cudnnHandle_t handle_;
  bool prologue_ = false;
  BackendDesc config_;  // the engine configuration the plan was made from
  BackendDesc plan_;
  bool accepted_ = false;
  std::string refusal_;
  std::string intermediates_ = "fp32";
  size_t workspace_ = 0;
  int tried_ = 0;
};

}  // namespace spotrain::cuda
