// The CPU backend: oneDNN for convolution, batch norm, pooling and inner product (forward
// and backward, primitives cached per shape), plain OpenMP loops for the rest. Activations
// stay in oneDNN's blocked layout (nChw16c, or nChw8c without AVX-512: blocked.h) from the
// first convolution to the global pool (or in NHWC, BackendOptions::cpu_activations: the op
// suite's second layout). Not final: tests derive from it to break a rule on purpose.
#pragma once
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/dnnl_util.h"
#include "kernels/ops.h"

namespace spotrain::cpu {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& opt);
  ~CpuBackend() override;

  Device device() const override { return Device::cpu; }
  std::string name() const override;
  Allocator& allocator() override { return Allocator::host(); }
  int threads() const override { return threads_; }
  std::string precision_note(DType compute, bool tf32) const override;

  Tensor to_host(const Tensor& t) override;
  Tensor from_host(const Tensor& t) override;
  Tensor upload_activation(const Tensor& host_nhwc, DType compute) override;
  void copy_to_host(const Tensor& src, Tensor& host_dst) override;
  bool remakes_bn_relu_inputs() const override { return remake_bn_relu_; }

 protected:
  // The ops (kernels/ops.h): cpu_backend.cpp (data movement, elementwise, linear, loss,
  // optimizer), cpu_conv.cpp (convolution), cpu_norm_pool.cpp (batch norm, pooling).
  Tensor upload_images_impl(const Tensor& host_nhwc, DType compute) override;
  Tensor cast_impl(const Tensor& t, DType to) override;
  Tensor zeros_impl(const Shape& shape) override;
  void fill_impl(Tensor& t, float value) override;
  void copy_impl(const Tensor& src, Tensor& dst) override;
  Tensor conv2d_forward_impl(const Tensor& x, const Tensor& w, const ConvParams& p) override;
  Tensor conv2d_backward_data_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                   const ConvParams& p) override;
  void conv2d_backward_weights_impl(const Tensor& x, const Tensor& dy, const ConvParams& p,
                                    Tensor& dw) override;
  void conv2d_backward_data_add_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                     const ConvParams& p, Tensor& acc) override;
  Tensor batchnorm_forward_train_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      float eps, bool relu, BnSaved& saved) override;
  Tensor batchnorm_forward_infer_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      const Tensor& running_mean, const Tensor& running_var,
                                      float eps, bool relu) override;
  Tensor batchnorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                 const Tensor& beta, const BnSaved& saved, float eps, bool relu,
                                 Tensor& dgamma, Tensor& dbeta) override;
  Tensor batchnorm_add_relu_forward_train_impl(const Tensor& x, const Tensor& z, const Tensor& gamma,
                                               const Tensor& beta, float eps, BnSaved& saved) override;
  void batchnorm_update_running_impl(Tensor& running_mean, Tensor& running_var,
                                     const BnSaved& saved, float momentum, int64_t n) override;
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
  Tensor linear_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw,
                              Tensor& db, bool need_dx) override;
  LossResult softmax_xent_impl(const Tensor& logits, const int32_t* labels, float smoothing,
                               float grad_scale, Tensor* dlogits, const LabelMix* mix) override;
  void sgd_step_impl(Tensor& params, const Tensor& grads, Tensor& momentum,
                     const std::vector<SgdSegment>& segments, const SgdHyper& h) override;
  void lars_step_impl(Tensor& params, const Tensor& grads, Tensor& momentum,
                      const std::vector<LarsSegment>& segments, const LarsHyper& h) override;
  bool unscale_and_check_impl(Tensor& grads, float inv_scale) override;
  void lerp_impl(Tensor& dst, const Tensor& src, float weight) override;

 private:
  struct ConvEntry;
  struct BnEntry;
  struct PoolEntry;
  ConvEntry& conv_entry(const Tensor& x, const Tensor& w, const ConvParams& p);
  BnEntry& bn_entry(const Tensor& x, bool relu, float eps);
  // The weights `w` (canonical, plain) reordered into `md`: into `holder` for this op alone,
  // or, from a version's kKeepWeightCopyFromUse-th use in that format, kept until the version
  // changes (cpu_conv.cpp says why).
  memory weights_as(const Tensor& w, const memory::desc& md, Tensor& holder);
  static constexpr int kKeepWeightCopyFromUse = 3;
  // `t` as a memory of descriptor `md`, reordering into a temporary when it differs.
  memory as_desc(const Tensor& t, const memory::desc& md, Tensor& holder);
  Tensor alloc_like_desc(const Shape& shape, const memory::desc& md);
  // acc += t, elementwise in place (same shape, layout and dtype).
  void add_into(Tensor& acc, const Tensor& t);
  // A tensor of x's shape, layout and dtype (padded like x).
  Tensor alloc_like(const Tensor& x, DType dt);
  // Where oneDNN has no kernels for a dtype (fp16; bf16 without AVX-512: via_f32), ops run in
  // fp32 on converted copies and round their results back (storage 16-bit, arithmetic fp32).
  Tensor f32(const Tensor& t) { return t.dtype() == DType::f32 ? t : cast(t, DType::f32); }

  // oneDNN's format of the activations between layers, and a new activation in it.
  memory::format_tag act_tag() const { return act_ == Layout::nhwc ? tag::nhwc : blocked_tag(); }
  Tensor alloc_act(const Shape& nchw, DType dt);

  DnnlContext ctx_;
  Layout act_ = Layout::blocked;  // BackendOptions::cpu_activations
  bool remake_bn_relu_ = true;    // SPOTRAIN_KEEP_BN_RELU_OUTPUTS=1 keeps them (core/environment.h)
  int threads_ = 1;
  std::unordered_map<std::string, std::unique_ptr<ConvEntry>> conv_cache_;
  std::unordered_map<std::string, std::unique_ptr<BnEntry>> bn_cache_;
  std::unordered_map<std::string, std::unique_ptr<PoolEntry>> pool_cache_;
  struct WeightCopy {
    memory::desc md;
    Tensor data;           // kept copy, or none
    uint64_t version = 0;  // the weights' Tensor::version() last used
    int uses = 0;          // uses of that version in this format
  };
  std::unordered_map<const void*, std::vector<WeightCopy>> weight_copies_;
};

}  // namespace spotrain::cpu
