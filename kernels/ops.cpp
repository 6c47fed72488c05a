// Backend's public ops (see ops.h): each times itself when an OpProfiler is attached and runs
// the backend's *_impl; and the default implementations a backend may keep (composed of other
// ops, or computing at once where a GPU queues).
#include "kernels/ops.h"

#include <cmath>
#include <string>
#include <type_traits>

#include "kernels/op_profiler.h"

namespace spotrain {

namespace {

std::string desc(const Tensor& t) {
  std::string s = dtype_name(t.dtype());
  s += "[";
  for (int i = 0; i < t.ndim(); ++i) s += (i ? "," : "") + std::to_string(t.dim(i));
  return s + "]";
}

std::string conv_desc(const Tensor& x, const Tensor& w, const ConvParams& p) {
  return std::to_string(p.kh) + "x" + std::to_string(p.kw) + "/" + std::to_string(p.stride) + " " +
         desc(x) + "->" + std::to_string(w.dim(0));
}

}  // namespace

template <class Run, class Shape>
auto Backend::timed(const char* op, Shape&& shape, Run&& run) -> decltype(run()) {
  struct Depth {  // restored when the op throws too
    int& d;
    const char*& running;
    ~Depth() {
      if (--d == 0) running = "";
    }
  } depth{++op_depth_, running_op_};
  SPOTRAIN_CHECK(op_depth_ <= kMaxOpDepth, "internal: backend ops nested ", op_depth_,
                 " deep at ", op, " (", name(),
                 "): a fallback calls the public op it implements (see kernels/ops.h)");
  if (op_depth_ == 1) running_op_ = op;
  if (!profiler_ || op_depth_ > 1) return run();  // inside another op: counted as that op
  const OpProfiler::Open o = profiler_->begin();
  if constexpr (std::is_void_v<decltype(run())>) {
    run();
    profiler_->end(o, op, shape());
  } else {
    auto r = run();
    profiler_->end(o, op, shape());
    return r;
  }
}

// ---- the ops ------------------------------------------------------------------------------

Tensor Backend::upload_images(const Tensor& x, DType compute) {
  return timed("upload_images", [&] { return desc(x); }, [&] { return upload_images_impl(x, compute); });
}
Tensor Backend::upload_pixels(const Tensor& x, const PixelNorm& norm, DType compute) {
  return timed("upload_pixels", [&] { return desc(x); },
               [&] { return upload_pixels_impl(x, norm, compute); });
}
Tensor Backend::cast(const Tensor& t, DType to) {
  return timed("cast", [&] { return desc(t) + "->" + dtype_name(to); }, [&] { return cast_impl(t, to); });
}
Tensor Backend::zeros(const Shape& shape) {
  return timed("zeros", [] { return std::string(); }, [&] { return zeros_impl(shape); });
}
void Backend::fill(Tensor& t, float value) {
  timed("fill", [&] { return desc(t); }, [&] { fill_impl(t, value); });
}
void Backend::copy(const Tensor& src, Tensor& dst) {
  timed("copy", [&] { return desc(src); }, [&] { copy_impl(src, dst); });
}
Tensor Backend::conv2d_forward(const Tensor& x, const Tensor& w, const ConvParams& p) {
  return timed("conv2d_forward", [&] { return conv_desc(x, w, p); },
               [&] { return conv2d_forward_impl(x, w, p); });
}
Tensor Backend::conv2d_backward_data(const Tensor& dy, const Tensor& w, const Tensor& x,
                                     const ConvParams& p) {
  return timed("conv2d_backward_data", [&] { return conv_desc(x, w, p); },
               [&] { return conv2d_backward_data_impl(dy, w, x, p); });
}
void Backend::conv2d_backward_weights(const Tensor& x, const Tensor& dy, const ConvParams& p,
                                      Tensor& dw) {
  timed("conv2d_backward_weights", [&] { return conv_desc(x, dw, p); },
        [&] { conv2d_backward_weights_impl(x, dy, p, dw); });
}
Tensor Backend::conv2d_forward_bn_stats(const Tensor& x, const Tensor& w, const ConvParams& p,
                                        const BnApply* pro, float eps, BnSaved* stats) {
  return timed(pro ? "bn_relu+conv2d_forward+stats" : "conv2d_forward+stats",
               [&] { return conv_desc(x, w, p); },
               [&] { return conv2d_forward_bn_stats_impl(x, w, p, pro, eps, stats); });
}
Tensor Backend::conv2d_backward_bn_relu(const Tensor& dy, const Tensor& w, const Tensor& x,
                                        const ConvParams& p, const BnApply& pro,
                                        const BnSaved& saved, Tensor& dw, Tensor& dgamma,
                                        Tensor& dbeta) {
  return timed("conv2d_backward+bn_relu", [&] { return conv_desc(x, w, p); }, [&] {
    return conv2d_backward_bn_relu_impl(dy, w, x, p, pro, saved, dw, dgamma, dbeta);
  });
}
void Backend::conv2d_backward_data_add(const Tensor& dy, const Tensor& w, const Tensor& x,
                                       const ConvParams& p, Tensor& acc) {
  timed("conv2d_backward_data_add", [&] { return conv_desc(x, w, p); },
        [&] { conv2d_backward_data_add_impl(dy, w, x, p, acc); });
}
Tensor Backend::batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                        float eps, bool relu, BnSaved& saved) {
  return timed(relu ? "batchnorm_forward+relu" : "batchnorm_forward", [&] { return desc(x); },
               [&] { return batchnorm_forward_train_impl(x, gamma, beta, eps, relu, saved); });
}
Tensor Backend::batchnorm_forward_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                        const Tensor& running_mean, const Tensor& running_var,
                                        float eps, bool relu) {
  return timed("batchnorm_infer", [&] { return desc(x); }, [&] {
    return batchnorm_forward_infer_impl(x, gamma, beta, running_mean, running_var, eps, relu);
  });
}
Tensor Backend::batchnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                   const Tensor& beta, const BnSaved& saved, float eps, bool relu,
                                   Tensor& dgamma, Tensor& dbeta) {
  return timed(relu ? "batchnorm_backward+relu" : "batchnorm_backward", [&] { return desc(x); }, [&] {
    return batchnorm_backward_impl(dy, x, gamma, beta, saved, eps, relu, dgamma, dbeta);
  });
}
Tensor Backend::batchnorm_add_relu_forward_train(const Tensor& x, const Tensor& z,
                                                 const Tensor& gamma, const Tensor& beta, float eps,
                                                 BnSaved& saved) {
  return timed("batchnorm_add_relu_forward", [&] { return desc(x); },
               [&] { return batchnorm_add_relu_forward_train_impl(x, z, gamma, beta, eps, saved); });
}
Tensor Backend::batchnorm_add_relu_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                            const Tensor& beta, BnSaved& saved, float eps,
                                            Tensor& dgamma, Tensor& dbeta, Tensor& dz) {
  return timed("batchnorm_add_relu_backward", [&] { return desc(x); }, [&] {
    return batchnorm_add_relu_backward_impl(dy, x, gamma, beta, saved, eps, dgamma, dbeta, dz);
  });
}
void Backend::batchnorm_update_running(Tensor& running_mean, Tensor& running_var,
                                       const BnSaved& saved, float momentum, int64_t n) {
  timed("batchnorm_update_running", [&] { return desc(running_mean); },
        [&] { batchnorm_update_running_impl(running_mean, running_var, saved, momentum, n); });
}
Tensor Backend::relu_forward(const Tensor& x) {
  return timed("relu_forward", [&] { return desc(x); }, [&] { return relu_forward_impl(x); });
}
Tensor Backend::relu_backward(const Tensor& dy, const Tensor& y) {
  return timed("relu_backward", [&] { return desc(y); }, [&] { return relu_backward_impl(dy, y); });
}
Tensor Backend::add_forward(const Tensor& a, const Tensor& b, bool relu) {
  return timed(relu ? "add_forward+relu" : "add_forward", [&] { return desc(a); },
               [&] { return add_forward_impl(a, b, relu); });
}
Tensor Backend::add_backward(const Tensor& dy, const Tensor& y, bool relu) {
  return timed(relu ? "add_backward+relu" : "add_backward", [&] { return desc(y); },
               [&] { return add_backward_impl(dy, y, relu); });
}
Tensor Backend::maxpool_forward(const Tensor& x, const PoolParams& p, Tensor& workspace) {
  return timed("maxpool_forward", [&] { return desc(x); },
               [&] { return maxpool_forward_impl(x, p, workspace); });
}
Tensor Backend::maxpool_backward(const Tensor& dy, const Tensor& x, const Tensor& workspace,
                                 const PoolParams& p) {
  return timed("maxpool_backward", [&] { return desc(x); },
               [&] { return maxpool_backward_impl(dy, x, workspace, p); });
}
Tensor Backend::global_avgpool_forward(const Tensor& x) {
  return timed("global_avgpool_forward", [&] { return desc(x); },
               [&] { return global_avgpool_forward_impl(x); });
}
Tensor Backend::global_avgpool_backward(const Tensor& dy, const Tensor& x) {
  return timed("global_avgpool_backward", [&] { return desc(x); },
               [&] { return global_avgpool_backward_impl(dy, x); });
}
Tensor Backend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& b) {
  return timed("linear_forward", [&] { return desc(x) + "->" + std::to_string(w.dim(0)); },
               [&] { return linear_forward_impl(x, w, b); });
}
Tensor Backend::linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw,
                                Tensor& db, bool need_dx) {
  return timed("linear_backward", [&] { return desc(x) + "->" + std::to_string(w.dim(0)); },
               [&] { return linear_backward_impl(dy, x, w, dw, db, need_dx); });
}
LossResult Backend::softmax_xent(const Tensor& logits, const int32_t* labels, float smoothing,
                                 float grad_scale, Tensor* dlogits, const LabelMix* mix) {
  return timed("softmax_xent", [&] { return desc(logits); },
               [&] { return softmax_xent_impl(logits, labels, smoothing, grad_scale, dlogits, mix); });
}
void Backend::softmax_xent_queue(const Tensor& logits, const int32_t* labels, float smoothing,
                                 float grad_scale, Tensor* dlogits, const LabelMix* mix) {
  timed("softmax_xent", [&] { return desc(logits); },
        [&] { softmax_xent_queue_impl(logits, labels, smoothing, grad_scale, dlogits, mix); });
}
void Backend::sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum,
                       const std::vector<SgdSegment>& segments, const SgdHyper& h) {
  timed("sgd_step", [&] { return desc(params); },
        [&] { sgd_step_impl(params, grads, momentum, segments, h); });
}
void Backend::lars_step(Tensor& params, const Tensor& grads, Tensor& momentum,
                        const std::vector<LarsSegment>& segments, const LarsHyper& h) {
  timed("lars_step", [&] { return desc(params); },
        [&] { lars_step_impl(params, grads, momentum, segments, h); });
}
bool Backend::unscale_and_check(Tensor& grads, float inv_scale) {
  return timed("unscale_and_check", [&] { return desc(grads); },
               [&] { return unscale_and_check_impl(grads, inv_scale); });
}
void Backend::unscale_check_queue(Tensor& grads, float inv_scale) {
  timed("unscale_and_check", [&] { return desc(grads); },
        [&] { unscale_check_queue_impl(grads, inv_scale); });
}
void Backend::lerp(Tensor& dst, const Tensor& src, float weight) {
  timed("lerp", [&] { return desc(dst); }, [&] { lerp_impl(dst, src, weight); });
}

// ---- defaults a backend may keep ----------------------------------------------------------

void Backend::conv2d_backward_data_add_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                            const ConvParams& p, Tensor& acc) {
  composed_conv2d_backward_data_add(dy, w, x, p, acc);
}
void Backend::check_pixel_batch(const Tensor& x, DType compute) {
  SPOTRAIN_CHECK(x.ndim() == 4 && x.layout() == Layout::nhwc && x.dtype() == DType::u8 &&
                     x.device() == Device::cpu && x.dim(1) >= 1 && x.dim(1) <= 3,
                 "upload_pixels expects a host 8-bit NHWC batch of 1 to 3 channels, got ",
                 x.describe());
  SPOTRAIN_CHECK(compute == DType::f32 || compute == DType::bf16 || compute == DType::f16,
                 "upload_pixels: the compute dtype must be fp32, bf16 or fp16, not ",
                 dtype_name(compute));
}

Tensor normalize_pixels_on_host(const Tensor& x, const PixelNorm& norm) {
  Backend::check_pixel_batch(x, DType::f32);
  const int64_t c = x.dim(1), n = x.numel();
  Tensor f = Tensor::host(x.shape(), DType::f32, Layout::nhwc);
  const uint8_t* src = static_cast<const uint8_t*>(x.raw());
  float* dst = f.data<float>();
  float scale[3], shift[3];
  for (int k = 0; k < 3; ++k) {
    scale[k] = norm.scale(k);
    shift[k] = norm.shift(k);
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = i % c;
    dst[i] = std::fma(float(src[i]), scale[k], shift[k]);
  }
  return f;
}

Tensor Backend::upload_pixels_impl(const Tensor& x, const PixelNorm& norm, DType compute) {
  check_pixel_batch(x, compute);
  return upload_images_impl(normalize_pixels_on_host(x, norm), compute);
}

Tensor Backend::conv2d_forward_bn_stats_impl(const Tensor& x, const Tensor& w, const ConvParams& p,
                                             const BnApply* pro, float eps, BnSaved* stats) {
  return composed_conv2d_forward_bn_stats(x, w, p, pro, eps, stats);
}
Tensor Backend::conv2d_backward_bn_relu_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                             const ConvParams& p, const BnApply& pro,
                                             const BnSaved& saved, Tensor& dw, Tensor& dgamma,
                                             Tensor& dbeta) {
  return composed_conv2d_backward_bn_relu(dy, w, x, p, pro, saved, dw, dgamma, dbeta);
}
Tensor Backend::batchnorm_add_relu_forward_train_impl(const Tensor& x, const Tensor& z,
                                                      const Tensor& gamma, const Tensor& beta,
                                                      float eps, BnSaved& saved) {
  return composed_batchnorm_add_relu_forward_train(x, z, gamma, beta, eps, saved);
}
Tensor Backend::batchnorm_add_relu_backward_impl(const Tensor& dy, const Tensor& x,
                                                 const Tensor& gamma, const Tensor& beta,
                                                 BnSaved& saved, float eps, Tensor& dgamma,
                                                 Tensor& dbeta, Tensor& dz) {
  return composed_batchnorm_add_relu_backward(dy, x, gamma, beta, saved, eps, dgamma, dbeta, dz);
}

// ---- the composed fused ops ---------------------------------------------------------------

void Backend::composed_conv2d_backward_data_add(const Tensor& dy, const Tensor& w, const Tensor& x,
                                                const ConvParams& p, Tensor& acc) {
  acc = add_forward(conv2d_backward_data(dy, w, x, p), acc, false);
}

// The composed conv + batch-norm statistics: the prologue as a batch norm with the given
// statistics (the inference op), the convolution, then the statistics of y through a training
// batch norm of unit scale and zero shift whose output is dropped.
Tensor Backend::composed_conv2d_forward_bn_stats(const Tensor& x, const Tensor& w,
                                                 const ConvParams& p, const BnApply* pro,
                                                 float eps, BnSaved* stats) {
  Tensor in = pro ? batchnorm_forward_infer(x, pro->gamma, pro->beta, pro->mean, pro->var,
                                            pro->eps, true)
                  : x;
  Tensor y = conv2d_forward(in, w, p);
  if (stats) {
    const int64_t k = y.dim(1);
    Tensor ones = zeros({k}), zero = zeros({k});
    fill(ones, 1.f);
    batchnorm_forward_train(y, ones, zero, eps, false, *stats);
  }
  return y;
}

// The composed backward through conv and the BN-ReLU prologue: the convolution's input made
// again (the forward never wrote it), its weight and data gradients, the ReLU's mask from that
// input, then the batch norm's backward from the statistics the forward made.
Tensor Backend::composed_conv2d_backward_bn_relu(const Tensor& dy, const Tensor& w,
                                                 const Tensor& x, const ConvParams& p,
                                                 const BnApply& pro, const BnSaved& saved,
                                                 Tensor& dw, Tensor& dgamma, Tensor& dbeta) {
  Tensor a = batchnorm_forward_infer(x, pro.gamma, pro.beta, pro.mean, pro.var, pro.eps, true);
  conv2d_backward_weights(a, dy, p, dw);
  Tensor g = relu_backward(conv2d_backward_data(dy, w, a, p), a);
  return batchnorm_backward(g, x, pro.gamma, pro.beta, saved, pro.eps, false, dgamma, dbeta);
}

Tensor Backend::composed_batchnorm_add_relu_forward_train(const Tensor& x, const Tensor& z,
                                                          const Tensor& gamma, const Tensor& beta,
                                                          float eps, BnSaved& saved) {
  Tensor y = add_forward(batchnorm_forward_train(x, gamma, beta, eps, false, saved), z, true);
  saved.backend_state[BnSaved::kComposedOutput] = y;
  return y;
}

Tensor Backend::composed_batchnorm_add_relu_backward(const Tensor& dy, const Tensor& x,
                                                     const Tensor& gamma, const Tensor& beta,
                                                     BnSaved& saved, float eps,
                                                     Tensor& dgamma, Tensor& dbeta, Tensor& dz) {
  // The saved output goes as soon as it has given the ReLU's mask: one activation less alive
  // while the batch norm's backward makes dx.
  Tensor y = std::move(saved.backend_state[BnSaved::kComposedOutput]);
  dz = add_backward(dy, y, true);
  y = Tensor();
  return batchnorm_backward(dz, x, gamma, beta, saved, eps, false, dgamma, dbeta);
}

void Backend::softmax_xent_queue_impl(const Tensor& logits, const int32_t* labels, float smoothing,
                                      float grad_scale, Tensor* dlogits, const LabelMix* mix) {
  queued_loss_ = softmax_xent(logits, labels, smoothing, grad_scale, dlogits, mix);
}

void Backend::unscale_check_queue_impl(Tensor& grads, float inv_scale) {
  queued_overflow_ = unscale_and_check(grads, inv_scale);
}

}  // namespace spotrain
