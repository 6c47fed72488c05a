// Basic layers (see layers.h): validation, stash management and calls into the Backend.
#include "layers/layers.h"

#include <utility>

#include "core/error.h"

namespace spotrain {

Tensor Layer::forward(const Tensor& x, Context& ctx) {
  validate(x);
  if (ctx.probe) ctx.probe(*this, x);
  if (!forward_scope_.text) forward_scope_ = AllocScope::name(kind() + " forward");
  AllocScope scope(forward_scope_);
  return forward_impl(x, ctx);
}

Tensor Layer::backward(const Tensor& dy, Context& ctx) {
  SPOTRAIN_CHECK(dy.defined(), "internal: ", name_, " backward got no gradient");
  if (!backward_scope_.text) backward_scope_ = AllocScope::name(kind() + " backward");
  AllocScope scope(backward_scope_);
  return backward_impl(dy, ctx);
}

namespace {
Param make_param(const std::string& prefix, const char* n, Shape shape, Param::Init init,
                 int64_t fan, bool no_decay) {
  Param p;
  p.name = join_name(prefix, n);
  p.value = Tensor::host(shape);
  p.grad = Tensor::host(shape);
  p.init = init;
  p.fan = fan;
  p.no_decay = no_decay;
  return p;
}
void check_4d(const Tensor& x, const std::string& name, int64_t channels) {
  SPOTRAIN_CHECK(x.ndim() == 4, name, ": expected a 4-D (N, C, H, W) input, got ", x.describe());
  SPOTRAIN_CHECK(channels < 0 || x.dim(1) == channels, name, ": expected ", channels,
                 " input channels, got ", x.describe());
  SPOTRAIN_CHECK(x.dim(0) > 0, name, ": empty batch");
}
}  // namespace

// ---- Conv2d ----

Conv2d::Conv2d(const std::string& name, int in_ch, int out_ch, int k, int stride, int pad)
    : Layer(name), in_(in_ch), out_(out_ch) {
  SPOTRAIN_CHECK(in_ch > 0 && out_ch > 0 && k > 0 && stride > 0 && pad >= 0,
                 name, ": bad convolution geometry");
  p_ = ConvParams{k, k, stride, pad};
  weight_ = make_param(name, "weight", {out_ch, in_ch, k, k}, Param::Init::kaiming_fan_out,
                       int64_t(out_ch) * k * k, false);
}

void Conv2d::validate(const Tensor& x) const {
  check_4d(x, name_, in_);
  SPOTRAIN_CHECK(x.dim(2) + 2 * p_.pad >= p_.kh && x.dim(3) + 2 * p_.pad >= p_.kw, name_,
                 ": input ", x.describe(), " is smaller than the ", p_.kh, "x", p_.kw, " kernel");
}

Tensor Conv2d::forward_impl(const Tensor& x, Context& ctx) {
  if (!ctx.training) return ctx.be.conv2d_forward(x, weight_.value, p_);
  BatchNorm2d* const stats_for = this->stats_for();
  const BatchNorm2d* const applies = this->applies();
  // x is the output of the batch norm + ReLU before (not fused): where the backend says so,
  // backward makes it again from that layer's stash instead of keeping it.
  remake_x_ = !applies && takes_ && ctx.be.remakes_bn_relu_inputs();
  x_ = remake_x_ ? Tensor() : x;
  // Fused: x is the un-normalized input of `applies`, whose statistics its forward took.
  if (applies) {
    const BatchNorm2d& bn = *applies;
    SPOTRAIN_CHECK(bn.saved_.mean.defined(), "internal: ", name_, " runs before ", bn.name());
    pro_ = BnApply{bn.gamma_.value, bn.beta_.value, bn.saved_.mean, bn.saved_.var, bn.eps_};
  }
  // Selective checkpointing: the kept output, held until this layer's backward (a segment
  // nested in a replayed one replays it again).
  if (ctx.replay && kept_y_.defined()) {
    SPOTRAIN_CHECK(kept_y_.dim(0) == x.dim(0), "internal: ", name_, " replays a batch of ",
                   x.dim(0), " for a kept output of ", kept_y_.dim(0));
    if (stats_for) stats_for->given_ = kept_stats_;
    return kept_y_;
  }
  Tensor y;
  BnSaved stats;
  if (!stats_for && !applies) {
    y = ctx.be.conv2d_forward(x, weight_.value, p_);
  } else {
    y = ctx.be.conv2d_forward_bn_stats(x, weight_.value, p_, applies ? &pro_ : nullptr,
                                       stats_for ? stats_for->eps_ : 0.f,
                                       stats_for ? &stats : nullptr);
  }
  if ((keep_output_ || (keep_if_stats_ && stats_for)) && ctx.keep_outputs) {
    kept_y_ = y;
    kept_stats_ = stats;
  }
  if (stats_for) stats_for->given_ = std::move(stats);
  return y;
}

Tensor Conv2d::backward_impl(const Tensor& dy, Context& ctx) {
  if (remake_x_) {
    const BatchNorm2d& bn = takes_->bn();
    SPOTRAIN_CHECK(bn.x_.defined() && bn.saved_.mean.defined(), "internal: ", name_,
                   " backward after ", bn.name(), "'s");
    x_ = ctx.be.batchnorm_forward_infer(bn.x_, bn.gamma_.value, bn.beta_.value, bn.saved_.mean,
                                        bn.saved_.var, bn.eps_, true);
    remake_x_ = false;
  }
  SPOTRAIN_CHECK(x_.defined(), "internal: ", name_, " backward without a forward stash");
  if (pro_.mean.defined()) {
    // Fused: backward through this convolution and the batch norm + ReLU it applied at once;
    // that batch norm's own backward then passes the gradient of its input through.
    SPOTRAIN_CHECK(takes_, "internal: ", name_, " applied a batch norm it is not linked to");
    BatchNorm2d& bn = takes_->bn();
    SPOTRAIN_CHECK(needs_input_grad_ && !acc_.defined(), "internal: ", name_,
                   " cannot apply a batch norm as the first layer of a block");
    Tensor dx = ctx.be.conv2d_backward_bn_relu(dy, weight_.value, x_, p_, pro_, bn.saved_,
                                               weight_.grad, bn.gamma_.grad, bn.beta_.grad);
    ctx.grad_ready(weight_);
    ctx.grad_ready(bn.gamma_);
    ctx.grad_ready(bn.beta_);
    bn.input_grad_done_ = true;
    clear_stash();
    return dx;
  }
  ctx.be.conv2d_backward_weights(x_, dy, p_, weight_.grad);
  ctx.grad_ready(weight_);
  Tensor dx;
  if (needs_input_grad_ && acc_.defined()) {
    ctx.be.conv2d_backward_data_add(dy, weight_.value, x_, p_, acc_);
    dx = std::move(acc_);
  } else if (needs_input_grad_) {
    dx = ctx.be.conv2d_backward_data(dy, weight_.value, x_, p_);
  }
  clear_stash();
  return dx;
}

void fuse_conv_bn_conv(Conv2d& a, BatchNorm2d& bn, Conv2d& b, bool fused) {
  SPOTRAIN_CHECK(bn.relu_ && a.out_ == bn.c_ && b.in_ == bn.c_ && !bn.link_ && !a.makes_ &&
                     !b.takes_,
                 "internal: cannot fuse ", a.name(), ", ", bn.name(), " and ", b.name());
  bn.link_ = std::make_unique<FusionLink>(a, bn, b, fused);
  a.makes_ = bn.link_.get();
  b.takes_ = bn.link_.get();
}

void FusionLink::set_fused(bool on) {
  SPOTRAIN_CHECK(!a_->busy() && !bn_->busy() && !b_->busy(), "internal: ", a_->name(), "+",
                 bn_->name(), "+", b_->name(), " switched while a forward waits for its backward");
  fused_ = on;
}

// ---- BatchNorm2d ----

BatchNorm2d::BatchNorm2d(const std::string& name, int channels, bool fused_relu, float eps,
                         float momentum)
    : Layer(name), c_(channels), relu_(fused_relu), eps_(eps), momentum_(momentum) {
  gamma_ = make_param(name, "weight", {channels}, Param::Init::ones, channels, true);
  beta_ = make_param(name, "bias", {channels}, Param::Init::zeros, channels, true);
  mean_ = Buffer{join_name(name, "running_mean"), Tensor::host({channels})};
  var_ = Buffer{join_name(name, "running_var"), Tensor::host({channels})};
  for (int i = 0; i < channels; ++i) {
    mean_.value.data<float>()[i] = 0.f;
    var_.value.data<float>()[i] = 1.f;
  }
}

void BatchNorm2d::collect_params(std::vector<Param*>& out) {
  out.push_back(&gamma_);
  out.push_back(&beta_);
}

void BatchNorm2d::collect_buffers(std::vector<Buffer*>& out) {
  out.push_back(&mean_);
  out.push_back(&var_);
}

void BatchNorm2d::clear_stash() {
  x_ = Tensor();
  saved_ = BnSaved();
  z_ = Tensor();
  added_ = false;
  given_ = BnSaved();
  input_grad_done_ = false;
}

void BatchNorm2d::validate(const Tensor& x) const { check_4d(x, name_, c_); }

Tensor BatchNorm2d::forward_impl(const Tensor& x, Context& ctx) {
  if (!ctx.training)
    return ctx.be.batchnorm_forward_infer(x, gamma_.value, beta_.value, mean_.value, var_.value,
                                          eps_, relu_);
  x_ = x;
  if (deferred()) {  // fused: the statistics came with x, the next convolution normalizes
    SPOTRAIN_CHECK(given_.mean.defined() && !z_.defined(), "internal: ", name_,
                   " runs fused without its convolution's statistics");
    saved_ = std::exchange(given_, BnSaved());
    if (ctx.update_running)
      ctx.be.batchnorm_update_running(mean_.value, var_.value, saved_, momentum_,
                                      x.dim(0) * x.dim(2) * x.dim(3));
    return x;
  }
  added_ = z_.defined();
  SPOTRAIN_CHECK(!added_ || z_.shape() == x.shape(), name_, ": the residual branch ",
                 z_.describe(), " does not match ", x.describe());
  Tensor y = added_ ? ctx.be.batchnorm_add_relu_forward_train(x, z_, gamma_.value, beta_.value,
                                                              eps_, saved_)
                    : ctx.be.batchnorm_forward_train(x, gamma_.value, beta_.value, eps_, relu_,
                                                     saved_);
  z_ = Tensor();
  // A checkpoint replay recomputes the same batch statistics; it must not count them twice
  // (and a scratch pass changes nothing of the model): Context::update_running.
  if (ctx.update_running)
    ctx.be.batchnorm_update_running(mean_.value, var_.value, saved_, momentum_,
                                    x.dim(0) * x.dim(2) * x.dim(3));
  return y;
}

Tensor BatchNorm2d::backward_impl(const Tensor& dy, Context& ctx) {
  SPOTRAIN_CHECK(x_.defined(), "internal: ", name_, " backward without a forward stash");
  if (deferred()) {  // the next convolution's backward went through this layer too: dy is x's
    SPOTRAIN_CHECK(input_grad_done_, "internal: ", name_, " backward before its convolution's");
    clear_stash();
    return dy;
  }
  Tensor dx = added_ ? ctx.be.batchnorm_add_relu_backward(dy, x_, gamma_.value, beta_.value,
                                                          saved_, eps_, gamma_.grad, beta_.grad,
                                                          dz_)
                     : ctx.be.batchnorm_backward(dy, x_, gamma_.value, beta_.value, saved_, eps_,
                                                 relu_, gamma_.grad, beta_.grad);
  ctx.grad_ready(gamma_);
  ctx.grad_ready(beta_);
  clear_stash();
  return dx;
}

// ---- ReLU ----

Tensor ReLU::forward_impl(const Tensor& x, Context& ctx) {
  Tensor y = ctx.be.relu_forward(x);
  if (ctx.training) y_ = y;
  return y;
}

Tensor ReLU::backward_impl(const Tensor& dy, Context& ctx) {
  Tensor dx = ctx.be.relu_backward(dy, y_);
  y_ = Tensor();
  return dx;
}

// ---- MaxPool2d ----

MaxPool2d::MaxPool2d(const std::string& name, int k, int stride, int pad) : Layer(name) {
  p_ = PoolParams{k, stride, pad};
}

void MaxPool2d::validate(const Tensor& x) const {
  check_4d(x, name_, -1);
  SPOTRAIN_CHECK(x.dim(2) + 2 * p_.pad >= p_.k && x.dim(3) + 2 * p_.pad >= p_.k, name_,
                 ": input ", x.describe(), " is smaller than the pooling window");
}

Tensor MaxPool2d::forward_impl(const Tensor& x, Context& ctx) {
  Tensor ws;
  Tensor y = ctx.be.maxpool_forward(x, p_, ws);
  if (ctx.training) {
    x_ = x;
    ws_ = ws;
  }
  return y;
}

Tensor MaxPool2d::backward_impl(const Tensor& dy, Context& ctx) {
  Tensor dx = ctx.be.maxpool_backward(dy, x_, ws_, p_);
  clear_stash();
  return dx;
}

// ---- GlobalAvgPool ----

void GlobalAvgPool::validate(const Tensor& x) const { check_4d(x, name_, -1); }

Tensor GlobalAvgPool::forward_impl(const Tensor& x, Context& ctx) {
  if (ctx.training) x_ = x;
  return ctx.be.global_avgpool_forward(x);
}

Tensor GlobalAvgPool::backward_impl(const Tensor& dy, Context& ctx) {
  Tensor dx = ctx.be.global_avgpool_backward(dy, x_);
  x_ = Tensor();
  return dx;
}

// ---- Linear ----

Linear::Linear(const std::string& name, int in_features, int out_features)
    : Layer(name), in_(in_features), out_(out_features) {
  SPOTRAIN_CHECK(in_features > 0 && out_features > 0, name, ": bad linear geometry");
  weight_ = make_param(name, "weight", {out_features, in_features}, Param::Init::uniform_fan_in,
                       in_features, false);
  bias_ = make_param(name, "bias", {out_features}, Param::Init::uniform_fan_in, in_features, true);
}

void Linear::collect_params(std::vector<Param*>& out) {
  out.push_back(&weight_);
  out.push_back(&bias_);
}

void Linear::validate(const Tensor& x) const {
  SPOTRAIN_CHECK(x.ndim() == 2 && x.dim(1) == in_, name_, ": expected (N, ", in_,
                 ") input, got ", x.describe());
}

Tensor Linear::forward_impl(const Tensor& x, Context& ctx) {
  if (ctx.training) x_ = x;
  return ctx.be.linear_forward(x, weight_.value, bias_.value);
}

Tensor Linear::backward_impl(const Tensor& dy, Context& ctx) {
  Tensor dx = ctx.be.linear_backward(dy, x_, weight_.value, weight_.grad, bias_.grad,
                                     needs_input_grad_);
  ctx.grad_ready(weight_);
  ctx.grad_ready(bias_);
  x_ = Tensor();
  return dx;
}

}  // namespace spotrain
