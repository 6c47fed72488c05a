// Sequential, Residual and Checkpointed (see containers.h).
#include "layers/containers.h"

#include "core/error.h"

namespace spotrain {

// ---- Sequential ----

Layer& Sequential::add(std::unique_ptr<Layer> l) {
  layers_.push_back(std::move(l));
  return *layers_.back();
}

void Sequential::collect_params(std::vector<Param*>& out) {
  for (auto& l : layers_) l->collect_params(out);
}

void Sequential::collect_buffers(std::vector<Buffer*>& out) {
  for (auto& l : layers_) l->collect_buffers(out);
}

void Sequential::visit(const std::function<void(Layer&)>& f) {
  f(*this);
  for (auto& l : layers_) l->visit(f);
}

void Sequential::clear_stash() {
  for (auto& l : layers_) l->clear_stash();
}

void Sequential::clear_stash_for_replay() {
  for (auto& l : layers_) l->clear_stash_for_replay();
}

void Sequential::set_needs_input_grad(bool v) {
  needs_input_grad_ = v;
  if (!layers_.empty()) layers_.front()->set_needs_input_grad(v);
}

Tensor Sequential::forward_impl(const Tensor& x, Context& ctx) {
  Tensor h = x;
  for (auto& l : layers_) h = l->forward(h, ctx);
  return h;
}

Tensor Sequential::backward_impl(const Tensor& dy, Context& ctx) {
  Tensor g = dy;
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
    g = (*it)->backward(g, ctx);
    if (!g.defined()) break;  // the first layer needs no input gradient
  }
  return g;
}

// ---- Residual ----

Residual::Residual(const std::string& name, std::unique_ptr<Layer> main,
                   std::unique_ptr<Layer> shortcut)
    : Layer(name), main_(std::move(main)), shortcut_(std::move(shortcut)) {
  if (auto* seq = dynamic_cast<Sequential*>(main_.get()); seq && seq->size() > 0) {
    auto* bn = dynamic_cast<BatchNorm2d*>(&seq->at(seq->size() - 1));
    if (bn && !bn->fused_relu()) tail_bn_ = bn;
    if (tail_bn_ && seq->size() > 1) head_conv_ = dynamic_cast<Conv2d*>(&seq->at(0));
  }
}

void Residual::collect_params(std::vector<Param*>& out) {
  main_->collect_params(out);
  if (shortcut_) shortcut_->collect_params(out);
}

void Residual::collect_buffers(std::vector<Buffer*>& out) {
  main_->collect_buffers(out);
  if (shortcut_) shortcut_->collect_buffers(out);
}

void Residual::visit(const std::function<void(Layer&)>& f) {
  f(*this);
  main_->visit(f);
  if (shortcut_) shortcut_->visit(f);
}

void Residual::clear_stash() {
  y_ = Tensor();
  fused_ = false;
  main_->clear_stash();
  if (shortcut_) shortcut_->clear_stash();
}

void Residual::clear_stash_for_replay() {
  y_ = Tensor();
  fused_ = false;
  main_->clear_stash_for_replay();
  if (shortcut_) shortcut_->clear_stash_for_replay();
}

Tensor Residual::forward_impl(const Tensor& x, Context& ctx) {
  fused_ = ctx.training && tail_bn_;
  if (fused_) {  // the shortcut first: the main branch's last BN adds it
    Tensor identity = shortcut_ ? shortcut_->forward(x, ctx) : x;
    tail_bn_->set_residual(identity);
    return main_->forward(x, ctx);
  }
  Tensor out = main_->forward(x, ctx);
  Tensor identity = shortcut_ ? shortcut_->forward(x, ctx) : x;
  SPOTRAIN_CHECK(out.shape() == identity.shape(), name_, ": branch shapes differ: ",
                 out.describe(), " vs ", identity.describe());
  Tensor y = ctx.be.add_forward(out, identity, /*relu=*/true);
  if (ctx.training) y_ = y;
  return y;
}

Tensor Residual::backward_impl(const Tensor& dy, Context& ctx) {
  if (fused_) {
    // The main branch layer by layer: the tail BN first gives the shortcut its gradient; the
    // shortcut's backward runs next, so the branch's first convolution can add its input
    // gradient to the shortcut's in one op.
    fused_ = false;
    auto& seq = static_cast<Sequential&>(*main_);
    size_t k = seq.size();
    Tensor g = seq.at(--k).backward(dy, ctx);
    Tensor dres = tail_bn_->take_residual_grad();
    SPOTRAIN_CHECK(dres.defined(), "internal: ", name_, " backward without the residual gradient");
    Tensor dshort = shortcut_ ? shortcut_->backward(dres, ctx) : dres;
    bool sum_in_conv = head_conv_ && needs_input_grad_ && head_conv_->needs_input_grad();
    if (sum_in_conv) head_conv_->add_input_grad_to(dshort);
    while (k > 0 && g.defined()) g = seq.at(--k).backward(g, ctx);
    if (sum_in_conv && !g.defined()) head_conv_->clear_stash();  // the sum never happened
    if (!needs_input_grad_) return Tensor();
    return sum_in_conv ? g : ctx.be.add_forward(g, dshort, /*relu=*/false);
  }
  Tensor g = ctx.be.add_backward(dy, y_, /*relu=*/true);
  y_ = Tensor();
  Tensor dshort = shortcut_ ? shortcut_->backward(g, ctx) : g;
  Tensor dmain = main_->backward(g, ctx);
  if (!needs_input_grad_) return Tensor();
  return ctx.be.add_forward(dmain, dshort, /*relu=*/false);
}

// ---- Checkpointed ----

Checkpointed::Checkpointed(std::unique_ptr<Layer> inner)
    : Layer(inner->name()), inner_(std::move(inner)) {}

Tensor Checkpointed::forward_impl(const Tensor& x, Context& ctx) {
  Tensor y = inner_->forward(x, ctx);
  // Also in a replay: a segment nested in a replayed one keeps its input for its own replay.
  if (ctx.training) {
    x_ = x;
    inner_->clear_stash_for_replay();  // keep only the segment's input (and kept outputs)
  }
  return y;
}

Tensor Checkpointed::backward_impl(const Tensor& dy, Context& ctx) {
  SPOTRAIN_CHECK(x_.defined(), "internal: ", name_, " backward without a forward input");
  const Context was = ctx;
  ctx.as_replay();  // rebuild the stash; BN must not update running statistics again
  inner_->forward(x_, ctx);
  ctx.replay = was.replay;
  ctx.update_running = was.update_running;
  ctx.keep_outputs = was.keep_outputs;
  x_ = Tensor();
  return inner_->backward(dy, ctx);
}

}  // namespace spotrain
