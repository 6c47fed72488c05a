// ProfiledBackend: wraps any Backend and times every op it forwards (GPU: events on the
// compute stream; CPU: the host clock), so `spotrain bench --profile` can say where a step's
// time goes, op by op and shape by shape, without a vendor profiler.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace spotrain {

class ProfiledBackend final : public Backend {
 public:
  explicit ProfiledBackend(std::unique_ptr<Backend> inner);

  // One line of the report: an op (or op and shape), its time and calls per step.
  struct Row {
    std::string name;
    double ms_per_step = 0;
    double calls_per_step = 0;
  };
  // Collects the times of the ops run since the last collect() into the totals; call at step
  // boundaries (it waits for the device). `count` says whether this step is counted.
  void collect(bool count);
  // Totals per op and per op+shape (heaviest first), averaged over the counted steps.
  std::vector<Row> by_op() const;
  std::vector<Row> by_shape(size_t top) const;
  // The report as printable lines.
  std::vector<std::string> report(size_t top_shapes = 15) const;

  Device device() const override { return inner_->device(); }
  std::string name() const override { return inner_->name(); }
  Allocator& allocator() override { return inner_->allocator(); }
  int threads() const override { return inner_->threads(); }
  Allocator& host_staging_allocator() override { return inner_->host_staging_allocator(); }

  Tensor upload_images(const Tensor& host_nhwc, DType compute) override;
  Tensor cast(const Tensor& t, DType to) override;
  Tensor to_host(const Tensor& t) override { return inner_->to_host(t); }
  Tensor from_host(const Tensor& t) override { return inner_->from_host(t); }
  void copy_to_host(const Tensor& src, Tensor& host_dst) override {
    inner_->copy_to_host(src, host_dst);
  }
  std::function<void()> copy_to_host_async(const Tensor& src, Tensor& host_dst) override {
    return inner_->copy_to_host_async(src, host_dst);
  }
  Tensor zeros(const Shape& shape) override;
  void fill(Tensor& t, float value) override;
  void copy(const Tensor& src, Tensor& dst) override;

  Tensor conv2d_forward(const Tensor& x, const Tensor& w, const ConvParams& p) override;
  Tensor conv2d_backward_data(const Tensor& dy, const Tensor& w, const Tensor& x,
                              const ConvParams& p) override;
  void conv2d_backward_weights(const Tensor& x, const Tensor& dy, const ConvParams& p,
                               Tensor& dw) override;
  void conv2d_backward_data_add(const Tensor& dy, const Tensor& w, const Tensor& x,
                                const ConvParams& p, Tensor& acc) override;
  Tensor batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 float eps, bool relu, BnSaved& saved) override;
  Tensor batchnorm_forward_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 const Tensor& running_mean, const Tensor& running_var, float eps,
                                 bool relu) override;
  Tensor batchnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                            const Tensor& beta, const BnSaved& saved, float eps, bool relu,
                            Tensor& dgamma, Tensor& dbeta) override;
  Tensor batchnorm_add_relu_forward_train(const Tensor& x, const Tensor& z, const Tensor& gamma,
                                          const Tensor& beta, float eps, BnSaved& saved) override;
  Tensor batchnorm_add_relu_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                     const Tensor& beta, const BnSaved& saved, float eps,
                                     Tensor& dgamma, Tensor& dbeta, Tensor& dz) override;
  void batchnorm_update_running(Tensor& running_mean, Tensor& running_var, const BnSaved& saved,
                                float momentum, int64_t n) override;
  Tensor relu_forward(const Tensor& x) override;
  Tensor relu_backward(const Tensor& dy, const Tensor& y) override;
  Tensor add_forward(const Tensor& a, const Tensor& b, bool relu) override;
  Tensor add_backward(const Tensor& dy, const Tensor& y, bool relu) override;
  Tensor maxpool_forward(const Tensor& x, const PoolParams& p, Tensor& workspace) override;
  Tensor maxpool_backward(const Tensor& dy, const Tensor& x, const Tensor& workspace,
                          const PoolParams& p) override;
  Tensor global_avgpool_forward(const Tensor& x) override;
  Tensor global_avgpool_backward(const Tensor& dy, const Tensor& x) override;
  Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& b) override;
  Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw, Tensor& db,
                         bool need_dx) override;
  LossResult softmax_xent(const Tensor& logits, const int32_t* labels, float smoothing,
                          float grad_scale, Tensor* dlogits, const LabelMix* mix = nullptr) override;
  void softmax_xent_queue(const Tensor& logits, const int32_t* labels, float smoothing,
                          float grad_scale, Tensor* dlogits, const LabelMix* mix = nullptr) override;
  LossResult queued_loss() override { return inner_->queued_loss(); }
  void sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum,
                const std::vector<SgdSegment>& segments, const SgdHyper& h) override;
  bool unscale_and_check(Tensor& grads, float inv_scale) override;
  void unscale_check_queue(Tensor& grads, float inv_scale) override;
  bool queued_overflow() override { return inner_->queued_overflow(); }
  void lerp(Tensor& dst, const Tensor& src, float weight) override;
  void synchronize() override { inner_->synchronize(); }
  bool queues_ops() const override { return inner_->queues_ops(); }
  void* native_stream() override { return inner_->native_stream(); }

 private:
  // Brackets one op: begin() before forwarding, end() after, with the op's name and a short
  // description of its shape.
  struct Open {
    int mark = -1;
    double host = 0;
  };
  Open begin();
  void end(const Open& o, const char* op, std::string shape);

  std::unique_ptr<Backend> inner_;
  bool device_clock_ = false;
  struct Pending {
    int begin_mark, end_mark;
    double host_ms;  // CPU: measured directly
    std::string op, shape;
  };
  std::vector<Pending> pending_;
  struct Total {
    double ms = 0;
    int64_t calls = 0;
  };
  std::map<std::string, Total> ops_, shapes_;
  int64_t steps_ = 0;
};

}  // namespace spotrain
