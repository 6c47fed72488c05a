// The float64 reference the op suite holds every backend against (health/op_cases.h), the
// CPU's own oneDNN path included: each op of kernels/ops.h as plain loops a reader can check
// against its formula, summing in double, on fp32 tensors kept in the canonical layout (4-D:
// NHWC; others plain). Slow on purpose; reached only by the op suite, the tests and `spotrain
// doctor`, never by training (tests/check_include_direction.cmake keeps it so).
#pragma once
#include <memory>

#include "kernels/ops.h"

namespace spotrain {

std::unique_ptr<Backend> make_reference_backend();

namespace reference {

// The backend; reference_backend.cpp holds data movement, elementwise ops, pooling, Linear, the
// loss and the optimizer steps, reference_conv_norm.cpp convolution and batch norm with the
// fused ops composed of them. Every op takes fp32 operands (a 16-bit one is refused: the op
// suite hands the reference the same values rounded, in fp32) and returns fp32, each value
// rounded once from its double.
class ReferenceBackend final : public Backend {
 public:
  Device device() const override { return Device::cpu; }
  std::string name() const override { return "float64 reference (plain loops)"; }
  Allocator& allocator() override { return Allocator::host(); }
  int threads() const override { return 1; }

  Tensor to_host(const Tensor& t) override;
  Tensor from_host(const Tensor& t) override;

 protected:
  Tensor upload_images_impl(const Tensor& host_nhwc, DType compute) override;
  Tensor upload_pixels_impl(const Tensor& host_nhwc_u8, const PixelNorm& norm, DType compute) override;
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
  Tensor conv2d_forward_bn_stats_impl(const Tensor& x, const Tensor& w, const ConvParams& p,
                                      const BnApply* pro, float eps, BnSaved* stats) override;
  Tensor conv2d_backward_bn_relu_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                      const ConvParams& p, const BnApply& pro,
                                      const BnSaved& saved, Tensor& dw, Tensor& dgamma,
                                      Tensor& dbeta) override;
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
  Tensor batchnorm_add_relu_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                          const Tensor& beta, BnSaved& saved, float eps,
                                          Tensor& dgamma, Tensor& dbeta, Tensor& dz) override;
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
};

// ---- what both files share: activations and parameters in double ----------------------------

// An activation (N, C, H, W) in double, in canonical NCHW order: the formulas index it as
// they are written.
struct Act {
  int64_t n = 0, c = 0, h = 0, w = 0;
  std::vector<double> v;
  Act() = default;
  Act(int64_t n_, int64_t c_, int64_t h_, int64_t w_)
      : n(n_), c(c_), h(h_), w(w_), v(size_t(n_ * c_ * h_ * w_), 0.) {}
  double& at(int64_t i, int64_t ch, int64_t y, int64_t x) { return v[size_t(((i * c + ch) * h + y) * w + x)]; }
  double at(int64_t i, int64_t ch, int64_t y, int64_t x) const {
    return v[size_t(((i * c + ch) * h + y) * w + x)];
  }
  Shape shape() const { return {n, c, h, w}; }
};

// An fp32 NHWC activation of this backend (refused otherwise, naming `op`) in double.
Act act_of(const Tensor& t, const char* op);
// An Act as this backend's fp32 NHWC tensor, each value rounded once.
Tensor tensor_of(const Act& a);
// Any plain fp32 tensor of this backend (refused otherwise) in double, in memory order.
std::vector<double> doubles_of(const Tensor& t, const char* op);
// A new plain fp32 tensor of `shape` holding v rounded; and v rounded into an existing one.
Tensor plain_of(const Shape& shape, const std::vector<double>& v);
void store(Tensor& t, const std::vector<double>& v);

}  // namespace reference
}  // namespace spotrain
