// Layers made of layers: Sequential, Residual (main branch + optional projection shortcut,
// joined by Add and ReLU) and Checkpointed (gradient checkpointing: keeps only its input in
// forward, replays forward at backward time to rebuild the stash; segments may nest).
#pragma once
#include <memory>
#include <vector>

#include "layers/layer.h"
#include "layers/layers.h"

namespace spotrain {

class Sequential : public Layer {
 public:
  using Layer::Layer;
  Layer& add(std::unique_ptr<Layer> l);
  template <typename T, typename... A>
  T& emplace(A&&... args) {
    return static_cast<T&>(add(std::make_unique<T>(std::forward<A>(args)...)));
  }
  void collect_params(std::vector<Param*>& out) override;
  void collect_buffers(std::vector<Buffer*>& out) override;
  void visit(const std::function<void(Layer&)>& f) override;
  void clear_stash() override;
  void clear_stash_for_replay() override;
  void set_needs_input_grad(bool v) override;
  std::string kind() const override { return "Sequential"; }
  size_t size() const { return layers_.size(); }
  Layer& at(size_t i) { return *layers_.at(i); }
  // Takes the layers out (used to regroup them into checkpointed segments).
  std::vector<std::unique_ptr<Layer>> release() { return std::move(layers_); }

 protected:
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  std::vector<std::unique_ptr<Layer>> layers_;
};

class Residual final : public Layer {
 public:
  // shortcut may be null (identity).
  Residual(const std::string& name, std::unique_ptr<Layer> main, std::unique_ptr<Layer> shortcut);
  void collect_params(std::vector<Param*>& out) override;
  void collect_buffers(std::vector<Buffer*>& out) override;
  void visit(const std::function<void(Layer&)>& f) override;
  void clear_stash() override;
  void clear_stash_for_replay() override;
  std::string kind() const override { return "Residual"; }

 protected:
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  std::unique_ptr<Layer> main_, shortcut_;
  // The main branch's last layer when it is a BatchNorm2d without ReLU: in training, it
  // computes relu(bn + shortcut) itself (one backend op, fused on cuDNN).
  BatchNorm2d* tail_bn_ = nullptr;
  // With tail_bn_: the main branch's first layer when it is a Conv2d, which then adds its
  // input gradient to the shortcut's (no separate Add in backward).
  Conv2d* head_conv_ = nullptr;
  bool fused_ = false;  // the stashed forward went through tail_bn_
  Tensor y_;            // stash: output after the ReLU (unfused forward)
};

class Checkpointed final : public Layer {
 public:
  explicit Checkpointed(std::unique_ptr<Layer> inner);
  void collect_params(std::vector<Param*>& out) override { inner_->collect_params(out); }
  void collect_buffers(std::vector<Buffer*>& out) override { inner_->collect_buffers(out); }
  void visit(const std::function<void(Layer&)>& f) override {
    f(*this);
    inner_->visit(f);
  }
  void clear_stash() override { x_ = Tensor(); inner_->clear_stash(); }
  void clear_stash_for_replay() override { x_ = Tensor(); inner_->clear_stash_for_replay(); }
  void set_needs_input_grad(bool v) override { inner_->set_needs_input_grad(v); }
  std::string kind() const override { return "Checkpointed"; }

 protected:
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  std::unique_ptr<Layer> inner_;
  Tensor x_;  // the only thing kept between forward and backward
};

}  // namespace spotrain
