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
                       float label_smoothing, StepTimes* times, const LabelMix* mix) {
  Backend& be = model_.backend();
  double t0 = now_seconds();
  Tensor x = be.upload_images(images, dtype_);
  if (times) be.synchronize();  // only to time the phases (a GPU keeps running)
  double upload = now_seconds() - t0;
  queue_uploaded(x, labels, lr, label_smoothing, times, mix);
  if (times) times->data = upload;
}

void StepRunner::queue_uploaded(const Tensor& x, const int32_t* labels, float lr,
                                float label_smoothing, StepTimes* times, const LabelMix* mix) {
  if (capture_ && eager_steps_ >= kEagerBeforeCapture) {
    queue_captured(x, labels, lr, label_smoothing, times, mix);
    return;
  }
  ++eager_steps_;
  double t1 = now_seconds();
  Tensor logits = model_.forward(x, /*training=*/true);
  // The step before is read back now, with this forward queued ahead of the device: its
  // verdict decides this step's loss scale, and the host waits while the device works.
  read_back();
  const double scale = scaler_.scale();
  queue_after_forward(logits, labels, lr, label_smoothing, scale, mix, times, t1);
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

void StepRunner::use_captured_steps() {
  Backend& be = model_.backend();
  SPOTRAIN_CHECK(be.capture() != nullptr, "--cuda-graph needs the CUDA backend; the ", be.name(),
                 " backend runs steps as they come (drop --cuda-graph)");
  SPOTRAIN_CHECK(sync_ == nullptr && world_ == 1,
                 "--cuda-graph trains on one GPU rank: the gradient all-reduce of several ranks "
                 "is not captured (drop --cuda-graph, or train on one rank)");
  capture_ = true;
}

void StepRunner::queue_captured(const Tensor& x, const int32_t* labels, float lr,
                                float label_smoothing, StepTimes* times, const LabelMix* mix) {
  Backend& be = model_.backend();
  StepCapture& cap = *be.capture();
  const double t0 = now_seconds();
  // The step before is read back first: this step's loss scale depends on its verdict, and
  // the replay refills the buffers its figures are read from. The device idles only for the
  // launch in between.
  read_back();
  const double scale = scaler_.scale();
  const StepInputs in{labels, mix, x.dim(0), lr, float(scale), float(1.0 / (scale * world_))};
  bool recorded_now = false;
  if (!graph_x_.defined()) {
    graph_x_ = be.cast(x, x.dtype());  // the batch's fixed place, which every replay reads
    // Every compute copy of the weights is refreshed inside the recorded step (and so in
    // each replay, after the update before it).
    model_.flat_params().mark_written();
    const int64_t sgd_steps = sgd_.steps();
    try {
      cap.begin_recording(in.n, mix != nullptr);
      Tensor logits = model_.forward(graph_x_, /*training=*/true);
      queue_after_forward(logits, labels, lr, label_smoothing, scale, mix, nullptr, 0.0);
      cap.end_recording();
    } catch (const Error& e) {
      // Recording ran nothing on the device: this step and the rest run as they come (a bad
      // input then fails there with its own error). What the cut-short forward stashed (kept
      // convolution outputs among it) lives in the recording's pool: let it go before the pool.
      cap.abort_recording();
      model_.clear_stash();
      cap.drop();
      graph_x_ = Tensor();
      sgd_.set_steps(sgd_steps);
      capture_ = false;
      capture_failure_ = e.what();
      // The recorded conversions of the weights to their compute copies ran nothing, but
      // marked the copies fresh: marked stale again, the eager step below converts them.
      model_.flat_params().mark_written();
      log_info(str("warning: --cuda-graph: the step could not be captured (", e.what(),
                   "); training goes on without it"));
      queue_uploaded(x, labels, lr, label_smoothing, times, mix);
      return;
    }
    recorded_now = true;
  } else {
    SPOTRAIN_CHECK(x.shape() == graph_x_.shape() && x.dtype() == graph_x_.dtype() &&
                       x.layout() == graph_x_.layout(),
                   "--cuda-graph: a batch of ", x.describe(), " where the captured step took ",
                   graph_x_.describe(), " (train without --cuda-graph)");
    if (x.raw() != graph_x_.raw()) be.copy(x, graph_x_);
  }
  cap.replay(in);
  // The replay updated the weights behind the host's back: eager forwards (evaluation)
  // refresh their copies.
  model_.flat_params().mark_written();
  // Recording counted the first update; an fp16 update is counted once its verdict is read.
  if (!recorded_now && !scaler_.enabled()) sgd_.count_applied();
  queued_ = true;
  queued_scale_ = scale;
  if (times) {
    be.synchronize();
    *times = StepTimes{};
    times->captured = now_seconds() - t0;
  }
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
                           float label_smoothing, StepTimes* times, const LabelMix* mix) {
  queue(images, labels, lr, label_smoothing, times, mix);
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
