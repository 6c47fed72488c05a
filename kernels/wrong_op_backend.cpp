// The wrong-op wrapper (see wrong_op_backend.h): each op forwards to the inner backend's
// public op; the result of one the hook names is doubled on the inner backend.
#include "kernels/wrong_op_backend.h"

#include <utility>

#include "core/environment.h"

namespace spotrain {

namespace {

class WrongOpBackend final : public Backend {
 public:
  explicit WrongOpBackend(std::unique_ptr<Backend> inner) : in_(std::move(inner)) {}

  // ---- what the backend is and has: the inner one's ----
  Device device() const override { return in_->device(); }
  std::string name() const override { return in_->name(); }
  Allocator& allocator() override { return in_->allocator(); }
  int threads() const override { return in_->threads(); }
  std::string precision_note(DType compute, bool tf32) const override {
    return in_->precision_note(compute, tf32);
  }
  std::string gpu_pci_bus_id() const override { return in_->gpu_pci_bus_id(); }
  std::string device_line() const override { return in_->device_line(); }
  std::vector<std::string> kernel_choices() override { return in_->kernel_choices(); }
  void save_kernel_choices() override { in_->save_kernel_choices(); }
  Tensor upload_activation(const Tensor& h, DType compute) override {
    return in_->upload_activation(h, compute);
  }
  Allocator& host_staging_allocator() override { return in_->host_staging_allocator(); }
  Tensor to_host(const Tensor& t) override { return in_->to_host(t); }
  Tensor from_host(const Tensor& t) override { return in_->from_host(t); }
  void copy_to_host(const Tensor& src, Tensor& dst) override { in_->copy_to_host(src, dst); }
  std::function<void()> copy_to_host_async(const Tensor& src, Tensor& dst) override {
    return in_->copy_to_host_async(src, dst);
  }
  LossResult queued_loss() override { return in_->queued_loss(); }
  bool queued_overflow() override { return in_->queued_overflow(); }
  void synchronize() override { in_->synchronize(); }
  void mark_step_begin() override { in_->mark_step_begin(); }
  void mark_step_backward_done() override { in_->mark_step_backward_done(); }
  double step_span_seconds() override { return in_->step_span_seconds(); }
  bool queues_ops() const override { return in_->queues_ops(); }
  DeviceStream* stream() override { return in_->stream(); }
  StepCapture* capture() override { return in_->capture(); }
  bool normalizes_pixels() const override { return in_->normalizes_pixels(); }
  bool fuses_conv_bn(DType compute) const override { return in_->fuses_conv_bn(compute); }
  bool remakes_bn_relu_inputs() const override { return in_->remakes_bn_relu_inputs(); }
  DeviceClock* device_clock() override { return in_->device_clock(); }
  KernelCache* kernel_cache() override { return in_->kernel_cache(); }

 protected:
  // ---- the ops: the inner backend's, the result of a planted one doubled ----
  Tensor upload_images_impl(const Tensor& h, DType compute) override {
    return planted(in_->upload_images(h, compute));
  }
  Tensor upload_pixels_impl(const Tensor& h, const PixelNorm& norm, DType compute) override {
    return planted(in_->upload_pixels(h, norm, compute));
  }
  Tensor cast_impl(const Tensor& t, DType to) override { return planted(in_->cast(t, to)); }
  Tensor zeros_impl(const Shape& shape) override { return planted(in_->zeros(shape)); }
  void fill_impl(Tensor& t, float value) override { in_->fill(t, value); }
  void copy_impl(const Tensor& src, Tensor& dst) override { in_->copy(src, dst); }
  Tensor conv2d_forward_impl(const Tensor& x, const Tensor& w, const ConvParams& p) override {
    return planted(in_->conv2d_forward(x, w, p));
  }
  Tensor conv2d_backward_data_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                   const ConvParams& p) override {
    return planted(in_->conv2d_backward_data(dy, w, x, p));
  }
  void conv2d_backward_weights_impl(const Tensor& x, const Tensor& dy, const ConvParams& p,
                                    Tensor& dw) override {
    in_->conv2d_backward_weights(x, dy, p, dw);
  }
  void conv2d_backward_data_add_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                     const ConvParams& p, Tensor& acc) override {
    in_->conv2d_backward_data_add(dy, w, x, p, acc);
  }
  Tensor conv2d_forward_bn_stats_impl(const Tensor& x, const Tensor& w, const ConvParams& p,
                                      const BnApply* pro, float eps, BnSaved* stats) override {
    return planted(in_->conv2d_forward_bn_stats(x, w, p, pro, eps, stats));
  }
  Tensor conv2d_backward_bn_relu_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                      const ConvParams& p, const BnApply& pro,
                                      const BnSaved& saved, Tensor& dw, Tensor& dgamma,
                                      Tensor& dbeta) override {
    return planted(in_->conv2d_backward_bn_relu(dy, w, x, p, pro, saved, dw, dgamma, dbeta));
  }
  Tensor batchnorm_forward_train_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      float eps, bool relu, BnSaved& saved) override {
    return planted(in_->batchnorm_forward_train(x, gamma, beta, eps, relu, saved));
  }
  Tensor batchnorm_forward_infer_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      const Tensor& rm, const Tensor& rv, float eps,
                                      bool relu) override {
    return planted(in_->batchnorm_forward_infer(x, gamma, beta, rm, rv, eps, relu));
  }
  Tensor batchnorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                 const Tensor& beta, const BnSaved& saved, float eps, bool relu,
                                 Tensor& dgamma, Tensor& dbeta) override {
    return planted(in_->batchnorm_backward(dy, x, gamma, beta, saved, eps, relu, dgamma, dbeta));
  }
  Tensor batchnorm_add_relu_forward_train_impl(const Tensor& x, const Tensor& z, const Tensor& gamma,
                                               const Tensor& beta, float eps, BnSaved& saved) override {
    return planted(in_->batchnorm_add_relu_forward_train(x, z, gamma, beta, eps, saved));
  }
  Tensor batchnorm_add_relu_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                          const Tensor& beta, BnSaved& saved, float eps,
                                          Tensor& dgamma, Tensor& dbeta, Tensor& dz) override {
    return planted(in_->batchnorm_add_relu_backward(dy, x, gamma, beta, saved, eps, dgamma, dbeta, dz));
  }
  void batchnorm_update_running_impl(Tensor& rm, Tensor& rv, const BnSaved& saved, float momentum,
                                     int64_t n) override {
    in_->batchnorm_update_running(rm, rv, saved, momentum, n);
  }
  Tensor relu_forward_impl(const Tensor& x) override { return planted(in_->relu_forward(x)); }
  Tensor relu_backward_impl(const Tensor& dy, const Tensor& y) override {
    return planted(in_->relu_backward(dy, y));
  }
  Tensor add_forward_impl(const Tensor& a, const Tensor& b, bool relu) override {
    return planted(in_->add_forward(a, b, relu));
  }
  Tensor add_backward_impl(const Tensor& dy, const Tensor& y, bool relu) override {
    return planted(in_->add_backward(dy, y, relu));
  }
  Tensor maxpool_forward_impl(const Tensor& x, const PoolParams& p, Tensor& ws) override {
    return planted(in_->maxpool_forward(x, p, ws));
  }
  Tensor maxpool_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& ws,
                               const PoolParams& p) override {
    return planted(in_->maxpool_backward(dy, x, ws, p));
  }
  Tensor global_avgpool_forward_impl(const Tensor& x) override {
    return planted(in_->global_avgpool_forward(x));
  }
  Tensor global_avgpool_backward_impl(const Tensor& dy, const Tensor& x) override {
    return planted(in_->global_avgpool_backward(dy, x));
  }
  Tensor linear_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b) override {
    return planted(in_->linear_forward(x, w, b));
  }
  Tensor linear_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw,
                              Tensor& db, bool need_dx) override {
    Tensor dx = in_->linear_backward(dy, x, w, dw, db, need_dx);
    return dx.defined() ? planted(dx) : dx;
  }
  LossResult softmax_xent_impl(const Tensor& logits, const int32_t* labels, float smoothing,
                               float grad_scale, Tensor* dlogits, const LabelMix* mix) override {
    return in_->softmax_xent(logits, labels, smoothing, grad_scale, dlogits, mix);
  }
  void softmax_xent_queue_impl(const Tensor& logits, const int32_t* labels, float smoothing,
                               float grad_scale, Tensor* dlogits, const LabelMix* mix) override {
    in_->softmax_xent_queue(logits, labels, smoothing, grad_scale, dlogits, mix);
  }
  void sgd_step_impl(Tensor& params, const Tensor& grads, Tensor& momentum,
                     const std::vector<SgdSegment>& segments, const SgdHyper& h) override {
    in_->sgd_step(params, grads, momentum, segments, h);
  }
  void lars_step_impl(Tensor& params, const Tensor& grads, Tensor& momentum,
                      const std::vector<LarsSegment>& segments, const LarsHyper& h) override {
    in_->lars_step(params, grads, momentum, segments, h);
  }
  bool unscale_and_check_impl(Tensor& grads, float inv_scale) override {
    return in_->unscale_and_check(grads, inv_scale);
  }
  void unscale_check_queue_impl(Tensor& grads, float inv_scale) override {
    in_->unscale_check_queue(grads, inv_scale);
  }
  void lerp_impl(Tensor& dst, const Tensor& src, float weight) override { in_->lerp(dst, src, weight); }

 private:
  // The result of the op running now, doubled (on the inner backend) where the hook names it.
  Tensor planted(Tensor r) {
    if (!wrong_op_planted(running_op())) return r;
    return in_->add_forward(r, r, false);
  }

  std::unique_ptr<Backend> in_;
};

}  // namespace

std::unique_ptr<Backend> plant_wrong_ops(std::unique_ptr<Backend> inner) {
  return std::make_unique<WrongOpBackend>(std::move(inner));
}

std::unique_ptr<Backend> plant_wrong_ops_if_asked(std::unique_ptr<Backend> be) {
  if (test_hooks().wrong_ops.empty()) return be;
  return plant_wrong_ops(std::move(be));
}

}  // namespace spotrain
