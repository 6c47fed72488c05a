// FusionChain (see fusion_chain.h).
#include "layers/fusion_chain.h"

#include <map>

#include "core/error.h"

namespace spotrain {

FusionChain::FusionChain(std::vector<Conv2d*> convs, std::vector<BatchNorm2d*> bns)
    : convs_(std::move(convs)), bns_(std::move(bns)) {
  SPOTRAIN_CHECK(!bns_.empty() && convs_.size() == bns_.size() + 1,
                 "internal: a fusion chain of ", convs_.size(), " convolutions and ", bns_.size(),
                 " batch norms");
}

void FusionChain::set_fused(bool on) {
  for (const Conv2d* c : convs_)
    SPOTRAIN_CHECK(!c->x_.defined() && !c->pro_.mean.defined() && !c->kept_y_.defined(),
                   "internal: ", name(), " switched while a forward waits for its backward");
  for (const BatchNorm2d* bn : bns_)
    SPOTRAIN_CHECK(!bn->x_.defined() && !bn->given_.mean.defined(), "internal: ", name(),
                   " switched while a forward waits for its backward");
  for (size_t i = 0; i < bns_.size(); ++i) {
    convs_[i]->stats_for_ = on ? bns_[i] : nullptr;
    bns_[i]->deferred_ = on;
    convs_[i + 1]->applies_ = on ? bns_[i] : nullptr;
  }
}

bool FusionChain::fused() const { return bns_.front()->deferred_; }

std::string FusionChain::name() const {
  auto last = [](const std::string& s) {
    const size_t d = s.rfind('.');
    return d == std::string::npos ? s : s.substr(d + 1);
  };
  const std::string& n = convs_.front()->name();
  const size_t dot = n.rfind('.');
  std::string out = dot == std::string::npos ? "" : n.substr(0, dot + 1);
  for (size_t i = 0; i < convs_.size(); ++i) {
    out += last(convs_[i]->name());
    if (i < bns_.size()) out += "+" + last(bns_[i]->name()) + "+";
  }
  return out;
}

std::string FusionChain::shape_key(const Tensor& x) const {
  std::string key = x.describe();
  for (const Conv2d* c : convs_)
    key += str(" ", c->in_, "->", c->out_, " ", c->p_.kh, "x", c->p_.kw, "/", c->p_.stride, "+",
               c->p_.pad);
  return key;
}

FusionChain::Scratch FusionChain::make_scratch(Backend& be) const {
  auto like = [&be](const Tensor& g) { return be.cast(g, g.dtype()); };
  Scratch s;
  for (size_t i = 1; i < convs_.size(); ++i) s.dw.push_back(like(convs_[i]->weight_.grad));
  for (const BatchNorm2d* bn : bns_) {
    s.dgamma.push_back(like(bn->gamma_.grad));
    s.dbeta.push_back(like(bn->beta_.grad));
  }
  return s;
}

void FusionChain::run(Backend& be, const Tensor& x, bool fused, Scratch& s) const {
  const size_t k = bns_.size();
  std::vector<Tensor> z(k + 1), in(k + 1);  // each convolution's output and input
  std::vector<BnSaved> saved(k);
  in[0] = x;
  if (fused) {
    std::vector<BnApply> pro(k);
    for (size_t i = 0; i <= k; ++i) {
      const Conv2d& c = *convs_[i];
      const BnApply* p = i > 0 ? &pro[i - 1] : nullptr;
      BnSaved* stats = i < k ? &saved[i] : nullptr;
      z[i] = be.conv2d_forward_bn_stats(in[i], c.weight_.value, c.p_, p, i < k ? bns_[i]->eps_ : 0.f,
                                        stats);
      if (i < k) {
        const BatchNorm2d& bn = *bns_[i];
        pro[i] = BnApply{bn.gamma_.value, bn.beta_.value, saved[i].mean, saved[i].var, bn.eps_};
        in[i + 1] = z[i];  // the next convolution reads it un-normalized
      }
    }
    Tensor dy = z[k];
    for (size_t i = k; i >= 1; --i) {
      const Conv2d& c = *convs_[i];
      dy = be.conv2d_backward_bn_relu(dy, c.weight_.value, in[i], c.p_, pro[i - 1], saved[i - 1],
                                      s.dw[i - 1], s.dgamma[i - 1], s.dbeta[i - 1]);
    }
    return;
  }
  for (size_t i = 0; i <= k; ++i) {
    const Conv2d& c = *convs_[i];
    z[i] = be.conv2d_forward(in[i], c.weight_.value, c.p_);
    if (i < k) {
      const BatchNorm2d& bn = *bns_[i];
      in[i + 1] = be.batchnorm_forward_train(z[i], bn.gamma_.value, bn.beta_.value, bn.eps_, true,
                                             saved[i]);
    }
  }
  Tensor dy = z[k];
  for (size_t i = k; i >= 1; --i) {
    const Conv2d& c = *convs_[i];
    be.conv2d_backward_weights(in[i], dy, c.p_, s.dw[i - 1]);
    Tensor da = be.conv2d_backward_data(dy, c.weight_.value, in[i], c.p_);
    const BatchNorm2d& bn = *bns_[i - 1];
    dy = be.batchnorm_backward(da, z[i - 1], bn.gamma_.value, bn.beta_.value, saved[i - 1], bn.eps_,
                               true, s.dgamma[i - 1], s.dbeta[i - 1]);
  }
}

std::vector<FusionChain> FusionChain::all_in(Layer& net) {
  // Every link (a, bn, b), in visiting order; links sharing a convolution join one chain.
  std::vector<BatchNorm2d*> links;
  net.visit([&links](Layer& l) {
    auto* bn = dynamic_cast<BatchNorm2d*>(&l);
    if (bn && bn->chain_a_ && bn->chain_b_) links.push_back(bn);
  });
  std::map<const Conv2d*, BatchNorm2d*> by_head;  // a -> its link
  std::map<const Conv2d*, bool> is_tail;          // b of some link
  for (BatchNorm2d* bn : links) {
    by_head[bn->chain_a_] = bn;
    is_tail[bn->chain_b_] = true;
  }
  std::vector<FusionChain> out;
  for (BatchNorm2d* first : links) {
    if (is_tail.count(first->chain_a_)) continue;  // inside a chain that starts earlier
    std::vector<Conv2d*> convs{first->chain_a_};
    std::vector<BatchNorm2d*> bns;
    for (BatchNorm2d* bn = first; bn; ) {
      bns.push_back(bn);
      convs.push_back(bn->chain_b_);
      auto next = by_head.find(bn->chain_b_);
      bn = next == by_head.end() ? nullptr : next->second;
    }
    out.emplace_back(std::move(convs), std::move(bns));
  }
  return out;
}

}  // namespace spotrain
