// One training step, in one place: upload the batch in the compute dtype -> forward ->
// softmax cross-entropy (times the loss scale) -> backward -> unscale + overflow verdict ->
// SGD on the fp32 master weights (skipped on overflow) -> loss-scaler update.
// The Trainer and `spotrain bench` both run steps through here.
#pragma once
#include <cstdint>

#include "engine/grad_sync.h"
#include "engine/loss_scaler.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "engine/precision.h"

namespace spotrain {

struct StepTimes {  // seconds, with the device synchronized between phases
  double data = 0, forward = 0, backward = 0, comm_exposed = 0, optimizer = 0;
};

struct StepResult {
  LossResult loss;
  bool overflow = false;  // fp16: the step was skipped
  double loss_scale = 1;
};

class StepRunner {
 public:
  // With a GradSync, gradients are summed over `world` ranks during backward, and the step
  // waits for that before the update.
  StepRunner(Model& model, Sgd& sgd, LossScaler& scaler, Precision precision,
             GradSync* sync = nullptr, int world = 1);
  // images: host fp32 NHWC (N, C, H, W); labels: N on the host.
  // mix: mixup/cutmix targets for the loss (null: plain labels).
  StepResult run(const Tensor& images, const int32_t* labels, float lr, float label_smoothing,
                 StepTimes* times = nullptr, const LabelMix* mix = nullptr);
  // The same step on a batch already uploaded (Backend::upload_images in compute_dtype()),
  // e.g. synthetic data generated once on the device; times->data is 0.
  StepResult run_uploaded(const Tensor& x, const int32_t* labels, float lr, float label_smoothing,
                          StepTimes* times = nullptr, const LabelMix* mix = nullptr);
  DType compute_dtype() const { return dtype_; }

 private:
  Model& model_;
  Sgd& sgd_;
  LossScaler& scaler_;
  DType dtype_;
  GradSync* sync_;
  int world_;
};

}  // namespace spotrain
