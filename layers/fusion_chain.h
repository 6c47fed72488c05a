// --fusion auto: the runs of convolutions and BN+ReLUs that fuse_conv_bn_conv linked (a basic
// block's conv1, bn1, conv2; a bottleneck's conv1, bn1, conv2, bn2, conv3, whose two links
// share conv2 and so are decided together), each switched on or off as a whole, and each
// runnable on its own both ways, into scratch tensors, so that the engine can time it at the
// shape it meets and keep the fusion only where it wins (engine/fusion_choice.h).
#pragma once
#include <string>
#include <vector>

#include "layers/layers.h"

namespace spotrain {

class FusionChain {
 public:
  // convs[i], bns[i], convs[i + 1] linked by fuse_conv_bn_conv for every i.
  FusionChain(std::vector<Conv2d*> convs, std::vector<BatchNorm2d*> bns);
  // On: each convolution makes the next batch norm's statistics, the batch norms pass their
  // input through, and the convolution after each applies it and its ReLU as it reads (and
  // its backward goes through them). Off: the layers run apart. Only between steps (throws
  // Error while a forward's stash waits for its backward).
  void set_fused(bool on);
  bool fused() const;
  std::string name() const;  // "layer1.0.conv1+bn1+conv2"
  // What the chain's speed depends on, on input x: x's shape and type, the convolutions'.
  std::string shape_key(const Tensor& x) const;
  const Conv2d& head() const { return *convs_.front(); }

  // Gradients a run writes instead of the model's, shaped and typed as them.
  struct Scratch {
    std::vector<Tensor> dw;              // convs 1.. (the first's backward is not run)
    std::vector<Tensor> dgamma, dbeta;   // per batch norm
  };
  Scratch make_scratch(Backend& be) const;
  // The chain's training forward and backward once, fused or as the separate layers run
  // them, on x (the first convolution's input; the last one's output stands in for its
  // gradient). The first convolution's own backward is left out: it is the same both ways.
  // Nothing of the model changes (running statistics included).
  void run(Backend& be, const Tensor& x, bool fused, Scratch& s) const;

  // Every chain fuse_conv_bn_conv linked in `net` (fused or not now), in visiting order.
  static std::vector<FusionChain> all_in(Layer& net);

 private:
  std::vector<Conv2d*> convs_;
  std::vector<BatchNorm2d*> bns_;
};

inline std::vector<FusionChain> fusion_chains(Layer& net) { return FusionChain::all_in(net); }

}  // namespace spotrain
