// FusionChain (see fusion_chain.h).
#include "layers/fusion_chain.h"

#include "core/error.h"

namespace spotrain {

void FusionChain::set_fused(bool on) {
  a_->stats_for_ = on ? bn_ : nullptr;
  bn_->deferred_ = on;
  b_->applies_ = on ? bn_ : nullptr;
}

bool FusionChain::fused() const { return bn_->deferred_; }

std::string FusionChain::name() const {
  const std::string& n = a_->name();
  const size_t dot = n.rfind('.');
  const std::string block = dot == std::string::npos ? "" : n.substr(0, dot + 1);
  auto last = [](const std::string& s) {
    const size_t d = s.rfind('.');
    return d == std::string::npos ? s : s.substr(d + 1);
  };
  return str(block, last(n), "+", last(bn_->name()), "+", last(b_->name()));
}

std::string FusionChain::shape_key(const Tensor& x) const {
  auto conv = [](const Conv2d& c) {
    return str(c.in_, "->", c.out_, " ", c.p_.kh, "x", c.p_.kw, "/", c.p_.stride, "+", c.p_.pad);
  };
  return str(x.describe(), " ", conv(*a_), " ", conv(*b_));
}

void FusionChain::run(Backend& be, const Tensor& x, bool fused) const {
  const Conv2d& a = *a_;
  const BatchNorm2d& bn = *bn_;
  const Conv2d& b = *b_;
  // Scratch gradients, shaped and typed as the model's.
  Tensor dw = be.cast(b.weight_.grad, b.weight_.grad.dtype());
  Tensor dgamma = be.cast(bn.gamma_.grad, bn.gamma_.grad.dtype());
  Tensor dbeta = be.cast(bn.beta_.grad, bn.beta_.grad.dtype());
  if (fused) {
    BnSaved stats;
    Tensor y1 = be.conv2d_forward_bn_stats(x, a.weight_.value, a.p_, nullptr, bn.eps_, &stats);
    const BnApply pro{bn.gamma_.value, bn.beta_.value, stats.mean, stats.var, bn.eps_};
    Tensor y = be.conv2d_forward_bn_stats(y1, b.weight_.value, b.p_, &pro, 0.f, nullptr);
    be.conv2d_backward_bn_relu(y, b.weight_.value, y1, b.p_, pro, stats, dw, dgamma, dbeta);
    return;
  }
  BnSaved saved;
  Tensor y1 = be.conv2d_forward(x, a.weight_.value, a.p_);
  Tensor y2 = be.batchnorm_forward_train(y1, bn.gamma_.value, bn.beta_.value, bn.eps_, true, saved);
  Tensor y = be.conv2d_forward(y2, b.weight_.value, b.p_);
  be.conv2d_backward_weights(y2, y, b.p_, dw);
  Tensor dy2 = be.conv2d_backward_data(y, b.weight_.value, y2, b.p_);
  be.batchnorm_backward(dy2, y1, bn.gamma_.value, bn.beta_.value, saved, bn.eps_, true, dgamma, dbeta);
}

std::vector<FusionChain> FusionChain::all_in(Layer& net) {
  std::vector<FusionChain> out;
  net.visit([&out](Layer& l) {
    auto* bn = dynamic_cast<BatchNorm2d*>(&l);
    if (bn && bn->chain_a_ && bn->chain_b_) out.emplace_back(*bn->chain_a_, *bn, *bn->chain_b_);
  });
  return out;
}

}  // namespace spotrain
