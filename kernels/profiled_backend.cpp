// ProfiledBackend (see profiled_backend.h).
#include "kernels/profiled_backend.h"

#include "core/clock.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace spotrain {

namespace {

double host_ms() { return 1e3 * now_seconds(); }

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

ProfiledBackend::ProfiledBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {
  device_clock_ = inner_->record_mark() >= 0;
  if (device_clock_) inner_->read_marks_ms();
}

ProfiledBackend::Open ProfiledBackend::begin() {
  Open o;
  if (device_clock_)
    o.mark = inner_->record_mark();
  else
    o.host = host_ms();
  return o;
}

void ProfiledBackend::end(const Open& o, const char* op, std::string shape) {
  Pending p{o.mark, -1, 0.0, op, std::move(shape)};
  if (device_clock_)
    p.end_mark = inner_->record_mark();
  else
    p.host_ms = host_ms() - o.host;
  pending_.push_back(std::move(p));
}

void ProfiledBackend::collect(bool count) {
  std::vector<double> ms;
  if (device_clock_) ms = inner_->read_marks_ms();
  if (count) {
    for (const Pending& p : pending_) {
      double t = device_clock_ ? ms.at(size_t(p.end_mark)) - ms.at(size_t(p.begin_mark)) : p.host_ms;
      Total& a = ops_[p.op];
      a.ms += t;
      ++a.calls;
      Total& b = shapes_[p.op + " " + p.shape];
      b.ms += t;
      ++b.calls;
    }
    ++steps_;
  }
  pending_.clear();
}

std::vector<ProfiledBackend::Row> ProfiledBackend::by_op() const {
  std::vector<Row> rows;
  double n = double(std::max<int64_t>(steps_, 1));
  for (auto& [k, v] : ops_) rows.push_back(Row{k, v.ms / n, double(v.calls) / n});
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.ms_per_step > b.ms_per_step; });
  return rows;
}

std::vector<ProfiledBackend::Row> ProfiledBackend::by_shape(size_t top) const {
  std::vector<Row> rows;
  double n = double(std::max<int64_t>(steps_, 1));
  for (auto& [k, v] : shapes_) rows.push_back(Row{k, v.ms / n, double(v.calls) / n});
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.ms_per_step > b.ms_per_step; });
  if (rows.size() > top) rows.resize(top);
  return rows;
}

std::vector<std::string> ProfiledBackend::report(size_t top_shapes) const {
  std::vector<std::string> out;
  auto ops = by_op();
  double total = 0;
  for (auto& r : ops) total += r.ms_per_step;
  char line[256];
  std::snprintf(line, sizeof line, "profile over %lld steps (%s clock): %.2f ms/step inside ops",
                (long long)steps_, device_clock_ ? "device" : "host", total);
  out.push_back(line);
  std::snprintf(line, sizeof line, "  %-28s %9s %6s %7s", "op", "ms/step", "share", "calls");
  out.push_back(line);
  for (auto& r : ops) {
    std::snprintf(line, sizeof line, "  %-28s %9.3f %5.1f%% %7.1f", r.name.c_str(), r.ms_per_step,
                  total > 0 ? 100 * r.ms_per_step / total : 0.0, r.calls_per_step);
    out.push_back(line);
  }
  out.push_back("  heaviest op shapes:");
  for (auto& r : by_shape(top_shapes)) {
    std::snprintf(line, sizeof line, "  %9.3f ms %5.1f  %s", r.ms_per_step, r.calls_per_step,
                  r.name.c_str());
    out.push_back(line);
  }
  return out;
}

// ---- forwarding ---------------------------------------------------------------------------

#define SPOTRAIN_TIMED(op, shape, call) \
  do {                                  \
    Open o_ = begin();                  \
    auto r_ = call;                     \
    end(o_, op, shape);                 \
    return r_;                          \
  } while (0)
#define SPOTRAIN_TIMED_VOID(op, shape, call) \
  do {                                       \
    Open o_ = begin();                       \
    call;                                    \
    end(o_, op, shape);                      \
  } while (0)

Tensor ProfiledBackend::upload_images(const Tensor& x, DType compute) {
  SPOTRAIN_TIMED("upload_images", desc(x), inner_->upload_images(x, compute));
}
Tensor ProfiledBackend::cast(const Tensor& t, DType to) {
  SPOTRAIN_TIMED("cast", desc(t) + "->" + dtype_name(to), inner_->cast(t, to));
}
Tensor ProfiledBackend::zeros(const Shape& shape) {
  SPOTRAIN_TIMED("zeros", "", inner_->zeros(shape));
}
void ProfiledBackend::fill(Tensor& t, float value) {
  SPOTRAIN_TIMED_VOID("fill", desc(t), inner_->fill(t, value));
}
void ProfiledBackend::copy(const Tensor& src, Tensor& dst) {
  SPOTRAIN_TIMED_VOID("copy", desc(src), inner_->copy(src, dst));
}
Tensor ProfiledBackend::conv2d_forward(const Tensor& x, const Tensor& w, const ConvParams& p) {
  SPOTRAIN_TIMED("conv2d_forward", conv_desc(x, w, p), inner_->conv2d_forward(x, w, p));
}
Tensor ProfiledBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, const Tensor& x,
                                             const ConvParams& p) {
  SPOTRAIN_TIMED("conv2d_backward_data", conv_desc(x, w, p),
                 inner_->conv2d_backward_data(dy, w, x, p));
}
void ProfiledBackend::conv2d_backward_weights(const Tensor& x, const Tensor& dy, const ConvParams& p,
                                              Tensor& dw) {
  SPOTRAIN_TIMED_VOID("conv2d_backward_weights", conv_desc(x, dw, p),
                      inner_->conv2d_backward_weights(x, dy, p, dw));
}
void ProfiledBackend::conv2d_backward_data_add(const Tensor& dy, const Tensor& w, const Tensor& x,
                                               const ConvParams& p, Tensor& acc) {
  SPOTRAIN_TIMED_VOID("conv2d_backward_data_add", conv_desc(x, w, p),
                      inner_->conv2d_backward_data_add(dy, w, x, p, acc));
}
Tensor ProfiledBackend::batchnorm_forward_train(const Tensor& x, const Tensor& gamma,
                                                const Tensor& beta, float eps, bool relu,
                                                BnSaved& saved) {
  SPOTRAIN_TIMED(relu ? "batchnorm_forward+relu" : "batchnorm_forward", desc(x),
                 inner_->batchnorm_forward_train(x, gamma, beta, eps, relu, saved));
}
Tensor ProfiledBackend::batchnorm_forward_infer(const Tensor& x, const Tensor& gamma,
                                                const Tensor& beta, const Tensor& running_mean,
                                                const Tensor& running_var, float eps, bool relu) {
  SPOTRAIN_TIMED("batchnorm_infer", desc(x),
                 inner_->batchnorm_forward_infer(x, gamma, beta, running_mean, running_var, eps, relu));
}
Tensor ProfiledBackend::batchnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                           const Tensor& beta, const BnSaved& saved, float eps,
                                           bool relu, Tensor& dgamma, Tensor& dbeta) {
  SPOTRAIN_TIMED(relu ? "batchnorm_backward+relu" : "batchnorm_backward", desc(x),
                 inner_->batchnorm_backward(dy, x, gamma, beta, saved, eps, relu, dgamma, dbeta));
}
Tensor ProfiledBackend::batchnorm_add_relu_forward_train(const Tensor& x, const Tensor& z,
                                                         const Tensor& gamma, const Tensor& beta,
                                                         float eps, BnSaved& saved) {
  SPOTRAIN_TIMED("batchnorm_add_relu_forward", desc(x),
                 inner_->batchnorm_add_relu_forward_train(x, z, gamma, beta, eps, saved));
}
Tensor ProfiledBackend::batchnorm_add_relu_backward(const Tensor& dy, const Tensor& x,
                                                    const Tensor& gamma, const Tensor& beta,
                                                    const BnSaved& saved, float eps, Tensor& dgamma,
                                                    Tensor& dbeta, Tensor& dz) {
  SPOTRAIN_TIMED("batchnorm_add_relu_backward", desc(x),
                 inner_->batchnorm_add_relu_backward(dy, x, gamma, beta, saved, eps, dgamma, dbeta, dz));
}
void ProfiledBackend::batchnorm_update_running(Tensor& running_mean, Tensor& running_var,
                                               const BnSaved& saved, float momentum, int64_t n) {
  SPOTRAIN_TIMED_VOID("batchnorm_update_running", desc(running_mean),
                      inner_->batchnorm_update_running(running_mean, running_var, saved, momentum, n));
}
Tensor ProfiledBackend::relu_forward(const Tensor& x) {
  SPOTRAIN_TIMED("relu_forward", desc(x), inner_->relu_forward(x));
}
Tensor ProfiledBackend::relu_backward(const Tensor& dy, const Tensor& y) {
  SPOTRAIN_TIMED("relu_backward", desc(y), inner_->relu_backward(dy, y));
}
Tensor ProfiledBackend::add_forward(const Tensor& a, const Tensor& b, bool relu) {
  SPOTRAIN_TIMED(relu ? "add_forward+relu" : "add_forward", desc(a), inner_->add_forward(a, b, relu));
}
Tensor ProfiledBackend::add_backward(const Tensor& dy, const Tensor& y, bool relu) {
  SPOTRAIN_TIMED(relu ? "add_backward+relu" : "add_backward", desc(y), inner_->add_backward(dy, y, relu));
}
Tensor ProfiledBackend::maxpool_forward(const Tensor& x, const PoolParams& p, Tensor& workspace) {
  SPOTRAIN_TIMED("maxpool_forward", desc(x), inner_->maxpool_forward(x, p, workspace));
}
Tensor ProfiledBackend::maxpool_backward(const Tensor& dy, const Tensor& x, const Tensor& workspace,
                                         const PoolParams& p) {
  SPOTRAIN_TIMED("maxpool_backward", desc(x), inner_->maxpool_backward(dy, x, workspace, p));
}
Tensor ProfiledBackend::global_avgpool_forward(const Tensor& x) {
  SPOTRAIN_TIMED("global_avgpool_forward", desc(x), inner_->global_avgpool_forward(x));
}
Tensor ProfiledBackend::global_avgpool_backward(const Tensor& dy, const Tensor& x) {
  SPOTRAIN_TIMED("global_avgpool_backward", desc(x), inner_->global_avgpool_backward(dy, x));
}
Tensor ProfiledBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& b) {
  SPOTRAIN_TIMED("linear_forward", desc(x) + "->" + std::to_string(w.dim(0)),
                 inner_->linear_forward(x, w, b));
}
Tensor ProfiledBackend::linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                        Tensor& dw, Tensor& db, bool need_dx) {
  SPOTRAIN_TIMED("linear_backward", desc(x) + "->" + std::to_string(w.dim(0)),
                 inner_->linear_backward(dy, x, w, dw, db, need_dx));
}
LossResult ProfiledBackend::softmax_xent(const Tensor& logits, const int32_t* labels, float smoothing,
                                         float grad_scale, Tensor* dlogits, const LabelMix* mix) {
  SPOTRAIN_TIMED("softmax_xent", desc(logits),
                 inner_->softmax_xent(logits, labels, smoothing, grad_scale, dlogits, mix));
}
void ProfiledBackend::softmax_xent_queue(const Tensor& logits, const int32_t* labels,
                                         float smoothing, float grad_scale, Tensor* dlogits,
                                         const LabelMix* mix) {
  SPOTRAIN_TIMED_VOID("softmax_xent", desc(logits),
                      inner_->softmax_xent_queue(logits, labels, smoothing, grad_scale, dlogits, mix));
}
void ProfiledBackend::sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum,
                               const std::vector<SgdSegment>& segments, const SgdHyper& h) {
  SPOTRAIN_TIMED_VOID("sgd_step", desc(params), inner_->sgd_step(params, grads, momentum, segments, h));
}
void ProfiledBackend::lerp(Tensor& dst, const Tensor& src, float weight) {
  SPOTRAIN_TIMED_VOID("lerp", desc(dst), inner_->lerp(dst, src, weight));
}
bool ProfiledBackend::unscale_and_check(Tensor& grads, float inv_scale) {
  SPOTRAIN_TIMED("unscale_and_check", desc(grads), inner_->unscale_and_check(grads, inv_scale));
}
void ProfiledBackend::unscale_check_queue(Tensor& grads, float inv_scale) {
  SPOTRAIN_TIMED_VOID("unscale_and_check", desc(grads), inner_->unscale_check_queue(grads, inv_scale));
}

#undef SPOTRAIN_TIMED
#undef SPOTRAIN_TIMED_VOID

}  // namespace spotrain
