// --fusion auto: the runs of convolutions and BN+ReLUs that fuse_conv_bn_conv linked (a basic
// block's conv1, bn1, conv2; a bottleneck's conv1, bn1, conv2, bn2, conv3, whose two links
// share conv2 and so are decided together), each switched on or off as a whole, and each
// runnable on its own both ways, through the very layers' training forward and backward, into
// scratch gradients, so that the engine can time and check it at the shape it meets and keep
// the fusion only where it wins (engine/fusion_choice.h).
#pragma once
#include <string>
#include <vector>

#include "kernels/op_tolerances.h"
#include "layers/layers.h"

namespace spotrain {

class FusionChain {
 public:
  // links[i].b() is links[i + 1].a() for every i.
  explicit FusionChain(std::vector<FusionLink*> links);
  // Switches every link of the chain (FusionLink::set_fused): only between steps (throws
  // Error while a forward's stash waits for its backward).
  void set_fused(bool on);
  bool fused() const { return links_.front()->fused(); }
  std::string name() const;  // "layer1.0.conv1+bn1+conv2"
  // What the chain's speed depends on, on input x: x's shape and type, the convolutions'.
  std::string shape_key(const Tensor& x) const;
  const Conv2d& head() const { return links_.front()->a(); }

  // Gradients a run writes instead of the model's, shaped and typed as them.
  struct Scratch {
    std::vector<Tensor> dw;              // convs 1.. (the first's backward is not run)
    std::vector<Tensor> dgamma, dbeta;   // per batch norm
  };
  Scratch make_scratch(Backend& be) const;
  // What a run gives besides its gradients.
  struct Result {
    Tensor y;   // the last convolution's output
    Tensor dx;  // the first batch norm's input gradient (what the first convolution's
                // backward would take)
  };
  // The chain's training forward and backward once, fused or apart, on x (the first
  // convolution's input; the last one's output stands in for its gradient): the layers' own
  // forward and backward (a Context::scratch pass) with the links switched as asked and the
  // parameter gradients going to `s`. The first convolution's own backward is left out: it is
  // the same both ways. Nothing of the model changes (links, gradients and running statistics
  // are as before, also when it throws).
  Result run(Backend& be, const Tensor& x, bool fused, Scratch& s);

  // The tensors of a run that a check compares, each with what it is ("the output of
  // layer1.0.conv2", "layer1.0.bn1.weight's gradient") and the kind of fused op that makes it
  // (whose tolerance the check takes, kernels/op_tolerances.h): the output, the input
  // gradient, then the parameter gradients.
  struct Outcome {
    std::string what;
    Tensor t;
    OpKind kind;
  };
  std::vector<Outcome> outcome(const Result& r, const Scratch& s) const;

  // Every chain fuse_conv_bn_conv linked in `net` (fused or not now), in visiting order.
  static std::vector<FusionChain> all_in(Layer& net);

 private:
  std::vector<FusionLink*> links_;
};

inline std::vector<FusionChain> fusion_chains(Layer& net) { return FusionChain::all_in(net); }

}  // namespace spotrain
