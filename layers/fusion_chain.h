// --fusion auto: the conv, BN+ReLU, conv chains that fuse_conv_bn_conv linked, each switched on
// or off as a whole, and each runnable on its own (both ways, into scratch tensors) so that the
// engine can time it at the shape it meets and keep the fusion only where it wins
// (engine/fusion_choice.h).
#pragma once
#include <string>
#include <vector>

#include "layers/layers.h"

namespace spotrain {

class FusionChain {
 public:
  FusionChain(Conv2d& a, BatchNorm2d& bn, Conv2d& b) : a_(&a), bn_(&bn), b_(&b) {}
  // On: a makes bn's statistics, bn passes its input through, b applies bn and its ReLU as it
  // reads (and its backward goes through them). Off: the three run as separate layers.
  void set_fused(bool on);
  bool fused() const;
  std::string name() const;  // "layer1.0.conv1+bn1+conv2"
  // What the chain's speed depends on, on input x: x's shape and type, both convolutions'.
  std::string shape_key(const Tensor& x) const;
  // The chain's training forward and backward once, fused or as the separate layers would run
  // them, on x (a's input; b's output stands in for its gradient). a's own backward is left
  // out: it is the same both ways. Outputs and gradients go to scratch tensors: nothing of the
  // model changes (running statistics included).
  void run(Backend& be, const Tensor& x, bool fused) const;
  const Conv2d& head() const { return *a_; }
  // Every chain fuse_conv_bn_conv linked in `net` (fused or not now), in visiting order.
  static std::vector<FusionChain> all_in(Layer& net);

 private:
  Conv2d* a_;
  BatchNorm2d* bn_;
  Conv2d* b_;
};

inline std::vector<FusionChain> fusion_chains(Layer& net) { return FusionChain::all_in(net); }

}  // namespace spotrain
