// FusionChain (see fusion_chain.h).
#include "layers/fusion_chain.h"

#include <map>
#include <utility>

#include "core/error.h"

namespace spotrain {

FusionChain::FusionChain(std::vector<FusionLink*> links) : links_(std::move(links)) {
  SPOTRAIN_CHECK(!links_.empty(), "internal: a fusion chain without links");
  for (size_t i = 0; i + 1 < links_.size(); ++i)
    SPOTRAIN_CHECK(&links_[i]->b() == &links_[i + 1]->a(), "internal: fusion links ",
                   links_[i]->bn().name(), " and ", links_[i + 1]->bn().name(), " do not meet");
}

void FusionChain::set_fused(bool on) {
  for (FusionLink* l : links_) l->set_fused(on);
}

std::string FusionChain::name() const {
  auto last = [](const std::string& s) {
    const size_t d = s.rfind('.');
    return d == std::string::npos ? s : s.substr(d + 1);
  };
  const std::string& n = head().name();
  const size_t dot = n.rfind('.');
  std::string out = dot == std::string::npos ? "" : n.substr(0, dot + 1);
  out += last(n);
  for (const FusionLink* l : links_) out += "+" + last(l->bn().name()) + "+" + last(l->b().name());
  return out;
}

std::string FusionChain::shape_key(const Tensor& x) const {
  std::string key = x.describe();
  auto conv = [&key](const Conv2d& c) {
    key += str(" ", c.in_, "->", c.out_, " ", c.p_.kh, "x", c.p_.kw, "/", c.p_.stride, "+",
               c.p_.pad);
  };
  conv(head());
  for (const FusionLink* l : links_) conv(l->b());
  return key;
}

FusionChain::Scratch FusionChain::make_scratch(Backend& be) const {
  auto like = [&be](const Tensor& g) { return be.cast(g, g.dtype()); };
  Scratch s;
  for (const FusionLink* l : links_) {
    s.dw.push_back(like(l->b().weight_.grad));
    s.dgamma.push_back(like(l->bn().gamma_.grad));
    s.dbeta.push_back(like(l->bn().beta_.grad));
  }
  return s;
}

namespace {

// While alive: the chain's links switched as a run asks and its parameters' gradients traded
// for the scratch ones; at its end (a throw included) every stash of the chain's layers
// dropped, then the gradients and links given back.
class RunScope {
 public:
  RunScope(std::vector<FusionLink*>& links, bool fused, FusionChain::Scratch& s) : links_(links) {
    for (FusionLink* l : links_) was_.push_back(l->fused());
    try {
      for (FusionLink* l : links_) l->set_fused(fused);
    } catch (...) {
      restore_links();
      throw;
    }
    trade(s);
    scratch_ = &s;
  }
  ~RunScope() {
    links_.front()->a().clear_stash();
    for (FusionLink* l : links_) {
      l->bn().clear_stash();
      l->b().clear_stash();
    }
    trade(*scratch_);
    restore_links();
  }
  RunScope(const RunScope&) = delete;
  RunScope& operator=(const RunScope&) = delete;

 private:
  void restore_links() {
    for (size_t i = 0; i < links_.size(); ++i) links_[i]->set_fused(was_[i]);
  }
  void trade(FusionChain::Scratch& s) {
    for (size_t i = 0; i < links_.size(); ++i) {
      std::swap(links_[i]->b().weight().grad, s.dw[i]);
      std::swap(links_[i]->bn().gamma().grad, s.dgamma[i]);
      std::swap(links_[i]->bn().beta().grad, s.dbeta[i]);
    }
  }
  std::vector<FusionLink*>& links_;
  std::vector<bool> was_;
  FusionChain::Scratch* scratch_ = nullptr;
};

}  // namespace

FusionChain::Result FusionChain::run(Backend& be, const Tensor& x, bool fused, Scratch& s) {
  SPOTRAIN_CHECK(s.dw.size() == links_.size() && s.dgamma.size() == links_.size() &&
                     s.dbeta.size() == links_.size(),
                 "internal: ", name(), " run with another chain's scratch gradients");
  RunScope scope(links_, fused, s);
  Context ctx{be, /*training=*/true, /*replay=*/false};
  ctx.scratch();
  Result r;
  Tensor h = links_.front()->a().forward(x, ctx);
  for (FusionLink* l : links_) h = l->b().forward(l->bn().forward(h, ctx), ctx);
  r.y = h;
  for (size_t i = links_.size(); i-- > 0;)
    h = links_[i]->bn().backward(links_[i]->b().backward(h, ctx), ctx);
  r.dx = h;
  return r;
}

std::vector<FusionChain::Outcome> FusionChain::outcome(const Result& r, const Scratch& s) const {
  std::vector<Outcome> out;
  out.push_back({str("the output of ", links_.back()->b().name()), r.y, OpKind::fused_forward});
  out.push_back({str("the input gradient of ", links_.front()->bn().name()), r.dx, OpKind::fused_backward});
  for (size_t i = 0; i < links_.size(); ++i) {
    out.push_back({links_[i]->b().weight_.name + "'s gradient", s.dw[i], OpKind::fused_weights});
    out.push_back({links_[i]->bn().gamma_.name + "'s gradient", s.dgamma[i], OpKind::fused_backward});
    out.push_back({links_[i]->bn().beta_.name + "'s gradient", s.dbeta[i], OpKind::fused_backward});
  }
  return out;
}

std::vector<FusionChain> FusionChain::all_in(Layer& net) {
  // Every link, in visiting order; links sharing a convolution join one chain.
  std::vector<FusionLink*> links;
  net.visit([&links](Layer& l) {
    auto* bn = dynamic_cast<BatchNorm2d*>(&l);
    if (bn && bn->link_) links.push_back(bn->link_.get());
  });
  std::map<const Conv2d*, FusionLink*> by_head;  // a -> its link
  std::map<const Conv2d*, bool> is_tail;         // b of some link
  for (FusionLink* l : links) {
    by_head[&l->a()] = l;
    is_tail[&l->b()] = true;
  }
  std::vector<FusionChain> out;
  for (FusionLink* first : links) {
    if (is_tail.count(&first->a())) continue;  // inside a chain that starts earlier
    std::vector<FusionLink*> chain;
    for (FusionLink* l = first; l;) {
      chain.push_back(l);
      auto next = by_head.find(&l->b());
      l = next == by_head.end() ? nullptr : next->second;
    }
    out.emplace_back(std::move(chain));
  }
  return out;
}

}  // namespace spotrain
