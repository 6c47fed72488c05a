// StepRunner (see step.h).
#include "engine/step.h"

#include <cmath>

#include "engine/core/clock.h"
#include "engine/core/error.h"

namespace spotrain {

StepRunner::StepRunner(Model& model, Sgd& sgd, LossScaler& scaler, Precision precision,
                       GradSync* sync, int world)
    : model_(model),
      sgd_(sgd),
      scaler_(scaler),
      dtype_(spotrain::compute_dtype(precision)),
      sync_(sync),
      world_(world) {}

StepResult StepRunner::run(const Tensor& images, const int32_t* labels, float lr,
                           float label_smoothing, StepTimes* times, const LabelMix* mix) {
  Backend& be = model_.backend();
  double t0 = now_seconds();
  Tensor x = be.upload_images(images, dtype_);
  if (times) be.synchronize();  // only to time the phases (a GPU keeps running)
  double upload = now_seconds() - t0;
  StepResult r = run_uploaded(x, labels, lr, label_smoothing, times, mix);
  if (times) times->data = upload;
  return r;
}

StepResult StepRunner::run_uploaded(const Tensor& x, const int32_t* labels, float lr,
                                    float label_smoothing, StepTimes* times,
                                    const LabelMix* mix) {
  Backend& be = model_.backend();
  StepResult r;
  r.loss_scale = scaler_.scale();
  double t1 = now_seconds();
  Tensor logits = model_.forward(x, /*training=*/true);
  Tensor dlogits;
  // The loss is read once backward is queued: no wait for the host mid-step.
  be.softmax_xent_queue(logits, labels, label_smoothing, float(r.loss_scale), &dlogits, mix);
  if (times) be.synchronize();
  double t2 = now_seconds();
  model_.backward(dlogits, sync_);
  if (times) be.synchronize();
  double t3 = now_seconds();
  // Gradients summed over ranks: every rank then reaches the same overflow verdict.
  double waited = sync_ ? sync_->finish() : 0.0;
  double t3b = now_seconds();
  r.loss = be.queued_loss();
  float grad_scale = 1.f / float(world_);
  if (scaler_.enabled()) {
    r.overflow = be.unscale_and_check(model_.flat_grads(), float(1.0 / (r.loss_scale * world_)));
    grad_scale = 1.f;
  }
  if (!r.overflow) {
    SPOTRAIN_CHECK(std::isfinite(r.loss.loss), "loss became ", r.loss.loss,
                   "; lower --lr or check the data");
    sgd_.step(lr, grad_scale);
  }
  scaler_.update(r.overflow);
  if (times) be.synchronize();
  double t4 = now_seconds();
  if (times) *times = StepTimes{0.0, t2 - t1, t3 - t2, waited, t4 - t3b};
  return r;
}

}  // namespace spotrain
