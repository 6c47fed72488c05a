// StepRunner (see step.h).
#include "engine/step.h"

#include <cmath>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/step_capture.h"

namespace spotrain {

StepRunner::StepRunner(Model& model, Sgd& sgd, LossScaler& scaler, Precision precision,
                       GradSync* sync, int world)
    : model_(model),
      sgd_(sgd),
      scaler_(scaler),
      dtype_(spotrain::compute_dtype(precision)),
      sync_(sync),
      world_(world),
      defer_(model.backend().queues_ops()) {}

void StepRunner::queue(const Tensor& images, const int32_t* labels, float lr,
                       float label_smoothing, StepTimes* times, const LabelMix* mix,
                       const PixelNorm* norm) {
  Backend& be = model_.backend();
  double t0 = now_seconds();
  const bool pixels = images.dtype() == DType::u8;
  SPOTRAIN_CHECK(!pixels || norm, "internal: 8-bit images without their normalization");
  Tensor x = pixels ? be.upload_pixels(images, *norm, dtype_) : be.upload_images(images, dtype_);
  if (times) be.synchronize();  // only to time the phases (a GPU keeps running)
  double upload = now_seconds() - t0;
  queue_uploaded(x, labels, lr, label_smoothing, times, mix);
  if (times) times->data = upload;
}

void StepRunner::queue_uploaded(const Tensor& x, const int32_t* labels, float lr,
                                float label_smoothing, StepTimes* times, const LabelMix* mix) {
  if (choose_fusion_) {  // before the first forward: the chains' links decide what it runs
    choose_fusion_ = false;
    fusion_verdicts_ = choose_fusion(model_, x);
    if (!fusion_verdicts_.empty()) log_info(fusion_summary(fusion_verdicts_));
  }
  const double t0 = now_seconds();
  Route route = route_for(x, mix);
  // An eager step queues its forward before the step before is read back, so the device works
  // while the host waits. A recording or replay cannot start before: the read-back's verdict
  // decides this step's loss scale, which goes into them.
  Tensor logits;
  if (route == Route::eager) logits = model_.forward(x, /*training=*/true);
  read_back();
  const double scale = scaler_.scale();
  if (route == Route::record && !record(x, labels, lr, label_smoothing, scale, mix))
    route = Route::eager;  // logged; this step and the rest run as they come
  if (route == Route::eager) {
    if (!logits.defined()) logits = model_.forward(x, /*training=*/true);
    queue_after_forward(logits, labels, lr, label_smoothing, scale, mix, times, t0);
  } else {
    const StepInputs in{labels, mix, x.dim(0), lr, float(scale), float(1.0 / (scale * world_))};
    replay(x, in, /*recorded_now=*/route == Route::record);
    if (times) {
      model_.backend().synchronize();
      *times = StepTimes{};
      times->captured = now_seconds() - t0;
    }
  }
  queued_ = true;
  queued_scale_ = scale;
  if (!defer_) read_back();
}

void StepRunner::queue_after_forward(const Tensor& logits, const int32_t* labels, float lr,
                                     float label_smoothing, double scale, const LabelMix* mix,
                                     StepTimes* times, double t1) {
  Backend& be = model_.backend();
  Tensor dlogits;
  be.softmax_xent_queue(logits, labels, label_smoothing, float(scale), &dlogits, mix);
  if (times) be.synchronize();
  double t2 = now_seconds();
  model_.backward(dlogits, sync_);
  if (times) be.synchronize();
  double t3 = now_seconds();
  // Gradients summed over ranks: every rank then reaches the same overflow verdict.
  double waited = sync_ ? sync_->finish() : 0.0;
  double t3b = now_seconds();
  if (scaler_.enabled()) {
    be.unscale_check_queue(model_.flat_grads(), float(1.0 / (scale * world_)));
    sgd_.step(lr, 1.f, /*unless_overflow=*/true);
  } else {
    sgd_.step(lr, 1.f / float(world_));
  }
  if (times) be.synchronize();
  double t4 = now_seconds();
  if (times) *times = StepTimes{0.0, t2 - t1, t3 - t2, waited, t4 - t3b};
}

std::string StepRunner::use_captured_steps() {
  Backend& be = model_.backend();
  if (be.capture() == nullptr) return str("the ", be.name(), " backend runs steps as they come");
  if (sync_ != nullptr || world_ != 1)
    return str(world_, " ranks train: the gradient all-reduce of several ranks is not captured");
  capture_ = true;
  return "";
}

StepRunner::Route StepRunner::route_for(const Tensor& x, const LabelMix* mix) {
  if (!capture_) return Route::eager;
  if (!graph_x_.defined()) {
    // Recorded after kEagerBeforeCapture eager steps of this very batch shape: they met every
    // kernel shape the recording needs (none may be chosen while recording).
    const bool alike = x.shape() == warm_shape_ && (mix != nullptr) == warm_mixed_;
    if (!alike) {
      warm_shape_ = x.shape();
      warm_mixed_ = mix != nullptr;
      warm_steps_ = 0;
    }
    if (warm_steps_ < kEagerBeforeCapture) {
      ++warm_steps_;
      return Route::eager;
    }
    return Route::record;
  }
  if (x.shape() == graph_x_.shape() && x.dtype() == graph_x_.dtype() &&
      x.layout() == graph_x_.layout() && (mix != nullptr) == graph_mixed_)
    return Route::replay;
  if (!told_other_batch_) {
    told_other_batch_ = true;
    log_info(str("captured steps: a batch of ", x.describe(), mix ? " with mixed targets" : "",
                 " where the recorded step took ", graph_x_.describe(),
                 graph_mixed_ ? " with mixed targets" : "", ": such steps run as they come"));
  }
  return Route::eager;
}

bool StepRunner::record(const Tensor& x, const int32_t* labels, float lr, float label_smoothing,
                        double scale, const LabelMix* mix) {
  Backend& be = model_.backend();
  StepCapture& cap = *be.capture();
  graph_x_ = be.cast(x, x.dtype());  // the batch's fixed place, which every replay reads
  graph_mixed_ = mix != nullptr;
  // Every compute copy of the weights is refreshed inside the recorded step (and so in each
  // replay, after the update before it).
  model_.flat_params().mark_written();
  const int64_t sgd_steps = sgd_.steps();
  try {
    cap.begin_recording(x.dim(0), mix != nullptr);
    Tensor logits = model_.forward(graph_x_, /*training=*/true);
    queue_after_forward(logits, labels, lr, label_smoothing, scale, mix, nullptr, 0.0);
    cap.end_recording();
    return true;
  } catch (const Error& e) {
    // Recording ran nothing on the device: the step runs as it comes (a bad input then fails
    // there with its own error). What the cut-short forward stashed (kept convolution outputs
    // among it) lives in the recording's pool: let it go before the pool.
    cap.abort_recording();
    model_.clear_stash();
    cap.drop();
    graph_x_ = Tensor();
    sgd_.set_steps(sgd_steps);
    capture_ = false;
    capture_failure_ = e.what();
    // The recorded conversions of the weights to their compute copies ran nothing, but marked
    // the copies fresh: marked stale again, the eager step converts them.
    model_.flat_params().mark_written();
    log_info(str("warning: captured steps: the step could not be recorded (", e.what(),
                 "); steps run as they come"));
    return false;
  }
}

void StepRunner::replay(const Tensor& x, const StepInputs& in, bool recorded_now) {
  Backend& be = model_.backend();
  if (!recorded_now && x.raw() != graph_x_.raw()) be.copy(x, graph_x_);  // recorded on a copy
  be.capture()->replay(in);
  // The replay updated the weights behind the host's back: eager forwards (evaluation, a batch
  // of another shape) refresh their copies.
  model_.flat_params().mark_written();
  // Recording counted the first update; an fp16 update is counted once its verdict is read.
  if (!recorded_now && !scaler_.enabled()) sgd_.count_applied();
}

void StepRunner::read_back() {
  if (!queued_) return;
  queued_ = false;
  Backend& be = model_.backend();
  StepResult r;
  r.loss_scale = queued_scale_;
  r.loss = be.queued_loss();
  if (scaler_.enabled()) r.overflow = be.queued_overflow();
  r.done_at = now_seconds();
  if (!r.overflow) {
    SPOTRAIN_CHECK(std::isfinite(r.loss.loss), "loss became ", r.loss.loss,
                   "; lower --lr or check the data");
    if (scaler_.enabled()) sgd_.count_applied();
  }
  scaler_.update(r.overflow);  // throws after too many overflows in a row
  results_.push_back(r);
}

void StepRunner::settle() { read_back(); }

std::vector<StepResult> StepRunner::take_results() {
  std::vector<StepResult> out;
  out.swap(results_);
  return out;
}

StepResult StepRunner::run(const Tensor& images, const int32_t* labels, float lr,
                           float label_smoothing, StepTimes* times, const LabelMix* mix,
                           const PixelNorm* norm) {
  queue(images, labels, lr, label_smoothing, times, mix, norm);
  settle();
  return take_results().back();
}

StepResult StepRunner::run_uploaded(const Tensor& x, const int32_t* labels, float lr,
                                    float label_smoothing, StepTimes* times,
                                    const LabelMix* mix) {
  queue_uploaded(x, labels, lr, label_smoothing, times, mix);
  settle();
  return take_results().back();
}

}  // namespace spotrain
