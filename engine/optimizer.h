// SGD with momentum, Nesterov and weight decay over the model's flat fp32 buffers
// (PyTorch torch.optim.SGD semantics), optionally excluding BN and bias parameters from
// weight decay; or LARS (--optimizer lars: each parameter tensor's step scaled by its trust
// ratio, the MLPerf ResNet-50 reference's form, kernels/elementwise.h), BN and bias parameters
// left out of both the adaptation and weight decay. The momentum buffer is flat too, so
// checkpoints save one array.
#pragma once
#include <string>
#include <vector>

#include "checkpoints/training_record.h"
#include "engine/model.h"

namespace spotrain {

// The optimizer's settings: checkpoints/training_record.h's, which a checkpoint keeps.
using SgdOptions = OptimizerSettings;

class Sgd {
 public:
  Sgd(Model& model, const SgdOptions& opt);
  // One update with learning rate lr; gradients are multiplied by grad_scale first. With
  // unless_overflow, the device skips it when the backend's last unscale_check_queue found
  // inf or NaN; such a step is counted by count_applied() once the host has read the verdict.
  void step(float lr, float grad_scale = 1.f, bool unless_overflow = false);
  void count_applied() { ++steps_; }
  Tensor& momentum() { return momentum_; }  // (P) fp32, same layout as the flat parameters
  const SgdOptions& options() const { return opt_; }
  const std::vector<SgdSegment>& segments() const { return segments_; }
  // --optimizer lars: one segment per adapted parameter tensor, the others merged.
  const std::vector<LarsSegment>& lars_segments() const { return lars_segments_; }
  bool lars() const { return opt_.kind == "lars"; }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }

 private:
  Model& model_;
  SgdOptions opt_;
  Tensor momentum_;
  std::vector<SgdSegment> segments_;
  std::vector<LarsSegment> lars_segments_;
  int64_t steps_ = 0;
};

}  // namespace spotrain
