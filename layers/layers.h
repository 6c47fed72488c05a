// The basic layers of ResNet-class models: Conv2d, BatchNorm2d (optional fused ReLU), ReLU,
// MaxPool2d, GlobalAvgPool, Linear. Each stashes exactly what its backward needs. A Conv2d,
// BatchNorm2d+ReLU, Conv2d run can be linked for conv + batch-norm fusion (fuse_conv_bn_conv).
#pragma once
#include "layers/layer.h"

namespace spotrain {

class BatchNorm2d;
class Conv2d;

// Conv + batch-norm fusion of one Conv2d, BatchNorm2d+ReLU, Conv2d run (fuse_conv_bn_conv): the
// one place its state lives. The batch norm owns it; the two convolutions point at it, and all
// three ask fused(). Fused, in training: `a` makes bn's batch statistics as it writes its
// output, bn passes that output through, and `b` applies bn and its ReLU as it reads it (its
// backward goes through them). Apart: the three layers run as they are. Evaluation always
// runs them apart.
class FusionLink {
 public:
  FusionLink(Conv2d& a, BatchNorm2d& bn, Conv2d& b, bool fused)
      : a_(&a), bn_(&bn), b_(&b), fused_(fused) {}
  FusionLink(const FusionLink&) = delete;
  FusionLink& operator=(const FusionLink&) = delete;
  bool fused() const { return fused_; }
  // Only between steps: throws Error while a forward of a, bn or b waits for its backward.
  void set_fused(bool on);
  Conv2d& a() const { return *a_; }
  BatchNorm2d& bn() const { return *bn_; }
  Conv2d& b() const { return *b_; }

 private:
  Conv2d* a_;
  BatchNorm2d* bn_;
  Conv2d* b_;
  bool fused_;
};

class Conv2d final : public Layer {
 public:
  Conv2d(const std::string& name, int in_ch, int out_ch, int k, int stride, int pad);
  void collect_params(std::vector<Param*>& out) override { out.push_back(&weight_); }
  void clear_stash() override {
    clear_stash_for_replay();
    kept_y_ = Tensor();
    kept_stats_ = BnSaved();
  }
  void clear_stash_for_replay() override {
    x_ = Tensor();
    remake_x_ = false;
    acc_ = Tensor();
    pro_ = BnApply();
  }
  std::string kind() const override { return "Conv2d"; }
  // --grad-checkpoint selective: the training forward's output outlives the segment's
  // clear_stash_for_replay, and every replay hands it back instead of convolving again, until
  // this layer's backward lets it go.
  void keep_output_for_replay(bool v) { keep_output_ = v; }
  Param& weight() { return weight_; }
  int in_channels() const { return in_; }
  int out_channels() const { return out_; }
  // Multiply-adds per output element: kernel area x input channels.
  int64_t macs_per_output() const { return int64_t(p_.kh) * p_.kw * in_; }
  // Under conv + batch-norm fusion: this convolution makes the next batch norm's statistics.
  bool makes_bn_statistics() const { return stats_for() != nullptr; }
  // --grad-checkpoint selective: keep the output too whenever this convolution makes a batch
  // norm's statistics (a fused chain may be switched on or off after the model is built).
  void keep_output_when_making_statistics(bool v) { keep_if_stats_ = v; }
  // Residual blocks: the next backward adds its input gradient to `g` (the shortcut's) and
  // returns the sum, in one backend op.
  void add_input_grad_to(const Tensor& g) { acc_ = g; }

 protected:
  void validate(const Tensor& x) const override;
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  friend void fuse_conv_bn_conv(Conv2d&, BatchNorm2d&, Conv2d&, bool);
  friend class FusionLink;
  friend class FusionChain;
  // Under a fused link: the batch norm after this convolution, whose statistics it computes,
  // and the one before it, which it applies (with its ReLU) to its input as it reads it.
  BatchNorm2d* stats_for() const { return makes_ && makes_->fused() ? &makes_->bn() : nullptr; }
  BatchNorm2d* applies() const { return takes_ && takes_->fused() ? &takes_->bn() : nullptr; }
  // Whether a forward's stash waits for its backward.
  bool busy() const {
    return x_.defined() || remake_x_ || pro_.mean.defined() || kept_y_.defined();
  }
  int in_, out_;
  ConvParams p_;
  Param weight_;  // (out, in, k, k)
  Tensor x_;      // stash: the input
  // Instead: the input is made again in backward from the batch norm + ReLU before
  // (Backend::remakes_bn_relu_inputs), which still holds its input and statistics then.
  bool remake_x_ = false;
  Tensor acc_;    // gradient the next backward adds its input gradient to
  // Conv + batch-norm fusion (fuse_conv_bn_conv): the link in which this convolution is `a`
  // (it makes the statistics) and the one in which it is `b` (it applies); each owned by its
  // batch norm. pro_ stashes what a fused forward applied.
  FusionLink* makes_ = nullptr;
  FusionLink* takes_ = nullptr;
  BnApply pro_;
  bool keep_output_ = false;
  bool keep_if_stats_ = false;
  Tensor kept_y_;        // the output the replay hands back (keep_output_for_replay)
  BnSaved kept_stats_;   // made with statistics: those statistics
};

class BatchNorm2d final : public Layer {
 public:
  BatchNorm2d(const std::string& name, int channels, bool fused_relu, float eps = 1e-5f,
              float momentum = 0.1f);
  void collect_params(std::vector<Param*>& out) override;
  void collect_buffers(std::vector<Buffer*>& out) override;
  void clear_stash() override;
  std::string kind() const override { return relu_ ? "BatchNorm2d+ReLU" : "BatchNorm2d"; }
  Param& gamma() { return gamma_; }
  Param& beta() { return beta_; }
  Buffer& running_mean() { return mean_; }
  Buffer& running_var() { return var_; }
  bool fused_relu() const { return relu_; }
  // Residual blocks: the next training forward computes relu(bn(x) + z) in one backend op
  // (z, the shortcut's output, is given just before it), and its backward leaves z's gradient
  // for take_residual_grad().
  void set_residual(const Tensor& z) { z_ = z; }
  Tensor take_residual_grad() { return std::move(dz_); }

 protected:
  void validate(const Tensor& x) const override;
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  friend class Conv2d;
  friend class FusionLink;
  friend class FusionChain;
  friend void fuse_conv_bn_conv(Conv2d&, BatchNorm2d&, Conv2d&, bool);
  bool deferred() const { return link_ && link_->fused(); }
  bool busy() const { return x_.defined() || given_.mean.defined(); }
  int c_;
  bool relu_;
  float eps_, momentum_;
  Param gamma_, beta_;    // (C) "weight", "bias" in torchvision
  Buffer mean_, var_;     // (C) running statistics
  Tensor x_;              // stash: the input
  BnSaved saved_;         // stash: batch statistics, ReLU mask
  Tensor z_;              // residual input of the next forward (set_residual)
  bool added_ = false;    // the stashed forward was relu(bn(x) + z)
  Tensor dz_;             // gradient of that z, after backward
  // Linked (fuse_conv_bn_conv) and fused, in training: the convolution before computes the
  // batch statistics (given_), this layer passes its input through, and the convolution after
  // applies the normalization and ReLU as it reads; that convolution's backward computes this
  // layer's gradients too (input_grad_done_), and this backward passes its gradient through.
  std::unique_ptr<FusionLink> link_;
  BnSaved given_;  // empty until the convolution before hands its statistics over
  bool input_grad_done_ = false;
};

// Links `a`, `bn` and `b` (consecutive in one branch, bn a BatchNorm2d+ReLU) for conv +
// batch-norm fusion, switched on (`fused`) or not yet: fused, in training, a's forward also
// computes bn's batch statistics, bn passes its input through, and b applies bn and its ReLU
// to what it reads (Backend::conv2d_forward_bn_stats, fused where the backend can). bn's output
// is never written; b's backward goes through bn as well (Backend::conv2d_backward_bn_relu).
// Evaluation runs the layers as they are. The link (bn's FusionLink) is switched on and off
// by its chain (FusionChain, layers/fusion_chain.h).
void fuse_conv_bn_conv(Conv2d& a, BatchNorm2d& bn, Conv2d& b, bool fused = true);

class ReLU final : public Layer {
 public:
  using Layer::Layer;
  void clear_stash() override { y_ = Tensor(); }
  std::string kind() const override { return "ReLU"; }

 protected:
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  Tensor y_;  // stash: the output
};

class MaxPool2d final : public Layer {
 public:
  MaxPool2d(const std::string& name, int k, int stride, int pad);
  void clear_stash() override { x_ = Tensor(); ws_ = Tensor(); }
  std::string kind() const override { return "MaxPool2d"; }

 protected:
  void validate(const Tensor& x) const override;
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  PoolParams p_;
  Tensor x_, ws_;
};

// (N, C, H, W) -> (N, C): the mean over H and W.
class GlobalAvgPool final : public Layer {
 public:
  using Layer::Layer;
  void clear_stash() override { x_ = Tensor(); }
  std::string kind() const override { return "GlobalAvgPool"; }

 protected:
  void validate(const Tensor& x) const override;
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  Tensor x_;
};

class Linear final : public Layer {
 public:
  Linear(const std::string& name, int in_features, int out_features);
  void collect_params(std::vector<Param*>& out) override;
  void clear_stash() override { x_ = Tensor(); }
  std::string kind() const override { return "Linear"; }
  Param& weight() { return weight_; }
  Param& bias() { return bias_; }

 protected:
  void validate(const Tensor& x) const override;
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;

 private:
  int in_, out_;
  Param weight_, bias_;  // (out, in), (out)
  Tensor x_;
};

}  // namespace spotrain
