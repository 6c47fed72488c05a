// StepRunner (see step.h).
#include "engine/step.h"

#include <algorithm>
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
      op_precision_(op_precision(dtype_, precision == Precision::tf32,
                                 model.backend().device() == Device::cuda)),
      sync_(sync),
      world_(world),
      defer_(model.backend().queues_ops()),
      units_(world) {}

void StepRunner::queue(const Tensor& images, const int32_t* labels, float lr,
                       float label_smoothing, StepTimes* times, const LabelMix* mix,
                       const PixelNorm* norm) {
  Backend& be = model_.backend();
  double t0 = now_seconds();
  Tensor x = upload(images, norm);
  if (times) be.synchronize();  // only to time the phases (a GPU keeps running)
  double upload = now_seconds() - t0;
  queue_uploaded(x, labels, lr, label_smoothing, times, mix);
  if (times) times->data += upload;  // a step of several micro-batches: each one's upload
}

Tensor StepRunner::upload(const Tensor& images, const PixelNorm* norm) {
  Backend& be = model_.backend();
  if (images.dtype() != DType::u8) return be.upload_images(images, dtype_);
  SPOTRAIN_CHECK(norm, "internal: 8-bit images without their normalization");
  FastPathChecks& checks = fast_path_checks();
  if (checks.off(kFastPathPixels)) return be.upload_images(normalize_pixels_on_host(images, *norm), dtype_);
  Tensor x = be.upload_pixels(images, *norm, dtype_);
  if (checks.checked(kFastPathPixels)) return x;
  // The first 8-bit batch: its upload against the same images normalized on the host in fp32
  // and uploaded as such (both rounded to the compute dtype once).
  Tensor want = be.upload_images(normalize_pixels_on_host(images, *norm), dtype_);
  const double tol = fast_path_tolerance(OpKind::rounding, op_precision_);
  const double e = normalized_difference(be.to_host(be.cast(x, DType::f32)),
                                         be.to_host(be.cast(want, DType::f32)));
  if (e <= tol) {
    checks.passed(kFastPathPixels, str("normalized difference ", fmt_sci(e), " within ", fmt_sci(tol)));
    return x;
  }
  checks.failed(kFastPathPixels,
                str("the 8-bit upload of ", images.describe(), " differs from its fp32 normalization "
                    "by ", fmt_sci(e), " (normalized, allowed ", fmt_sci(tol),
                    "); batches are normalized on the host"));
  return want;
}

void StepRunner::queue_uploaded(const Tensor& x, const int32_t* labels, float lr,
                                float label_smoothing, StepTimes* times, const LabelMix* mix) {
  if (choose_fusion_) {  // before the first forward: the chains' links decide what it runs
    choose_fusion_ = false;
    fusion_verdicts_ = choose_fusion(model_, x, &fast_path_checks(), sync_ ? &sync_->worker() : nullptr);
    if (!fusion_verdicts_.empty()) log_info(fusion_summary(fusion_verdicts_));
  }
  const double t0 = now_seconds();
  if (accum_ > 1) return queue_micro_batch(x, labels, lr, label_smoothing, times, mix, t0);
  Route route = route_for(x, mix);
  // An eager step queues its forward before the step before is read back, so the device works
  // while the host waits. A recording or replay cannot start before: the read-back's verdict
  // decides this step's loss scale, which goes into them.
  Tensor logits;
  if (route == Route::eager) {
    if (sync_) model_.backend().mark_step_begin();  // several ranks: never captured
    logits = model_.forward(x, /*training=*/true);
  }
  read_back();
  const double scale = scaler_.scale();
  if (route == Route::record && !fast_path_checks().checked(kFastPathCapture)) {
    record_checked(x, labels, lr, label_smoothing, scale, mix);
    if (times) {
      model_.backend().synchronize();
      *times = StepTimes{};
      times->captured = now_seconds() - t0;
    }
    return;  // read back: its figures are taken
  }
  if (route == Route::record && !record(x, labels, lr, label_smoothing, scale, mix))
    route = Route::eager;  // logged; this step and the rest run as they come
  if (route == Route::eager) {
    if (!logits.defined()) logits = model_.forward(x, /*training=*/true);
    queue_after_forward(logits, labels, lr, label_smoothing, scale, mix, times, t0);
  } else {
    const StepInputs in{labels, mix, x.dim(0), lr, float(scale), float(1.0 / (scale * double(units_)))};
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
  if (sync_) be.mark_step_backward_done();
  if (times) be.synchronize();
  double t3 = now_seconds();
  // Gradients summed over ranks: every rank then reaches the same overflow verdict.
  double waited = sync_ ? sync_->finish() : 0.0;
  queued_wait_ = waited;
  double t3b = now_seconds();
  queue_update(lr, scale);
  if (times) be.synchronize();
  double t4 = now_seconds();
  if (times) *times = StepTimes{0.0, t2 - t1, t3 - t2, waited, t4 - t3b};
}

void StepRunner::queue_update(float lr, double scale) {
  // The gradients hold the sum over the ranks of the step's units_ micro-batches (each its
  // own mean): their mean is what one rank's batch of all of them would give.
  if (scaler_.enabled()) {
    model_.backend().unscale_check_queue(model_.flat_grads(), float(1.0 / (scale * double(units_))));
    sgd_.step(lr, 1.f, /*unless_overflow=*/true);
  } else {
    sgd_.step(lr, 1.f / float(units_));
  }
}

// ---- gradient accumulation ---------------------------------------------------------------

class StepRunner::AccumulatingListener final : public GradListener {
 public:
  AccumulatingListener(Model& model, const Tensor& sum, GradSync* sync)
      : model_(model), sum_(sum), sync_(sync), added_(model.params().size(), false) {}
  void grad_ready(const Param& p) override {
    add(p);
    if (sync_) sync_->grad_ready(p);  // the bucket's all-reduce is queued after the add
  }
  // Parameters backward did not report (none, by the layer contract): before the all-reduce
  // launches their buckets.
  void add_rest() {
    for (const Param* p : model_.params()) add(*p);
  }

 private:
  void add(const Param& p) {
    const size_t i = model_.index_of(&p);
    if (added_[i]) return;
    added_[i] = true;
    Backend& be = model_.backend();
    Tensor g = p.grad;  // a view into the flat gradients
    const Tensor s = Tensor::view(sum_, model_.offset_of(&p), g.shape());
    be.copy(be.add_forward(g, s, /*relu=*/false), g);
  }
  Model& model_;
  const Tensor& sum_;
  GradSync* sync_;
  std::vector<bool> added_;  // by parameter index
};

std::string StepRunner::set_accum_steps(int k, int64_t units) {
  SPOTRAIN_CHECK(k >= 1, "--accum-steps must be at least 1, got ", k);
  SPOTRAIN_CHECK(units == 0 || units >= k, "internal: ", k, " micro-batches of a step of ", units);
  SPOTRAIN_CHECK(micro_ == 0, "internal: the micro-batches per step changed inside a step");
  accum_ = k;
  units_ = units > 0 ? units : int64_t(world_) * k;
  if (k == 1 || !capture_) return "";
  const std::string why = use_captured_steps();  // says why not, as at the start
  if (graph_x_.defined())
    stop_capturing(why);
  else
    capture_ = false;
  return why;
}

void StepRunner::add_micro_loss(const LossResult& l, int64_t rows) {
  micro_loss_.loss_sum += l.loss * double(rows);
  micro_loss_.rows += rows;
  micro_loss_.top1 += l.top1;
  micro_loss_.top5 += l.top5;
}

void StepRunner::queue_micro_batch(const Tensor& x, const int32_t* labels, float lr,
                                   float label_smoothing, StepTimes* times, const LabelMix* mix,
                                   double t0) {
  Backend& be = model_.backend();
  // As an eager step: the forward is queued before anything is read back. Only the first
  // micro-batch updates the batch-norm running statistics, as only rank 0's are kept of K
  // ranks (each updating once a step): the run's statistics are those of rank 0 of K ranks.
  if (micro_ == 0 && sync_) be.mark_step_begin();
  Tensor logits = model_.forward(x, /*training=*/true, /*update_running=*/micro_ == 0);
  if (micro_ == 0) {
    read_back();  // the step before: its verdict sets the loss scale of all this step's micro-batches
    micro_scale_ = scaler_.scale();
    micro_loss_ = MicroLoss{};
    if (times) *times = StepTimes{};
  } else {
    // The micro-batch before's loss (the backend keeps one queued loss at a time).
    add_micro_loss(be.queued_loss(), micro_rows_);
  }
  Tensor dlogits;
  be.softmax_xent_queue(logits, labels, label_smoothing, float(micro_scale_), &dlogits, mix);
  micro_rows_ = x.dim(0);
  if (times) be.synchronize();
  const double t2 = now_seconds();
  if (micro_ + 1 < accum_) {
    // Not the last: no all-reduce; the gradients (overwritten by backward) go into the sum.
    model_.backward(dlogits, nullptr);
    grad_sum_ = micro_ == 0 ? be.cast(model_.flat_grads(), DType::f32)
                            : be.add_forward(model_.flat_grads(), grad_sum_, /*relu=*/false);
    ++micro_;
    if (times) {
      be.synchronize();
      times->forward += t2 - t0;
      times->backward += now_seconds() - t2;
    }
    return;
  }
  // The last: each parameter's sum is completed as backward finishes it, and its all-reduce
  // bucket goes as before, overlapping the rest of this backward.
  {
    AccumulatingListener listener(model_, grad_sum_, sync_);
    model_.backward(dlogits, &listener);
    listener.add_rest();
  }
  if (sync_) be.mark_step_backward_done();
  if (times) be.synchronize();
  const double t3 = now_seconds();
  const double waited = sync_ ? sync_->finish() : 0.0;
  queued_wait_ = waited;
  const double t3b = now_seconds();
  queue_update(lr, micro_scale_);  // one overflow verdict over the sum of all micro-batches
  micro_ = 0;
  grad_sum_ = Tensor();
  if (times) {
    be.synchronize();
    times->forward += t2 - t0;
    times->backward += t3 - t2;
    times->comm_exposed = waited;
    times->optimizer = now_seconds() - t3b;
  }
  queued_ = true;
  queued_scale_ = micro_scale_;
  if (!defer_) read_back();
}

std::string StepRunner::use_captured_steps() {
  Backend& be = model_.backend();
  if (be.capture() == nullptr) return str("the ", be.name(), " backend runs steps as they come");
  if (fast_path_checks().off(kFastPathCapture))
    return str("a first-use check found captured steps wrong on this device (",
               fast_path_checks().why_off(kFastPathCapture), ")");
  if (accum_ > 1)
    return str("--accum-steps ", accum_, ": each step's ", accum_, " micro-batches run as they come");
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
    sgd_.set_steps(sgd_steps);
    stop_capturing(e.what());
    log_info(str("warning: captured steps: the step could not be recorded (", e.what(),
                 "); steps run as they come"));
    return false;
  }
}

void StepRunner::stop_capturing(const std::string& why) {
  drop_recording();
  capture_ = false;
  capture_failure_ = why;
}

void StepRunner::drop_recording() {
  model_.backend().capture()->drop();
  graph_x_ = Tensor();
  // The recorded conversions of the weights to their compute copies ran nothing, but marked
  // the copies fresh: marked stale again, the eager step converts them.
  model_.flat_params().mark_written();
}

StepRunner::StepState StepRunner::save_state() {
  Backend& be = model_.backend();
  StepState s;
  s.params = be.cast(model_.flat_params(), DType::f32);
  s.momentum = be.cast(sgd_.momentum(), DType::f32);
  if (model_.flat_buffers().defined()) s.buffers = be.cast(model_.flat_buffers(), DType::f32);
  Tensor h = be.to_host(model_.flat_params());
  s.host_params.assign(h.data<float>(), h.data<float>() + h.numel());
  s.sgd_steps = sgd_.steps();
  s.scaler = scaler_.state();
  s.results = results_.size();
  return s;
}

void StepRunner::restore_state(const StepState& s) {
  Backend& be = model_.backend();
  be.copy(s.params, model_.flat_params());
  be.copy(s.momentum, sgd_.momentum());
  if (s.buffers.defined()) be.copy(s.buffers, model_.flat_buffers());
  model_.flat_params().mark_written();
  sgd_.set_steps(s.sgd_steps);
  scaler_.set_state(s.scaler);
  results_.resize(s.results);
}

StepRunner::StepFigures StepRunner::read_figures(double scale, bool accepted) {
  queued_ = true;
  queued_scale_ = scale;
  StepFigures f;
  if (accepted) {
    read_back();
    f.result = results_.back();
  } else {
    f.result = take_queued();
  }
  Backend& be = model_.backend();
  Tensor g = be.to_host(model_.flat_grads());
  double sq = 0;
  for (int64_t i = 0; i < g.numel(); ++i) sq += double(g.data<float>()[i]) * g.data<float>()[i];
  f.grad_norm = std::sqrt(sq);
  Tensor p = be.to_host(model_.flat_params());
  f.params.assign(p.data<float>(), p.data<float>() + p.numel());
  Tensor m = be.to_host(sgd_.momentum());
  f.momentum.assign(m.data<float>(), m.data<float>() + m.numel());
  return f;
}

namespace {

double relative(double got, double want) {
  if (got == want) return 0;
  return std::fabs(got - want) / std::max(std::fabs(want), 1e-30);
}

// What the captured step's check found: "" and not inconclusive where it matched the eager
// step.
struct StepCheck {
  std::string difference;     // what differs beyond tol
  bool inconclusive = false;  // both overflowed (fp16): no gradient or update to compare
};

// The captured step's figures against the eager step's, from the weights `before`.
StepCheck compare_steps(const std::vector<float>& before, double eager_loss, double eager_norm,
                        bool eager_overflow, const std::vector<float>& eager_p,
                        const std::vector<float>& eager_m, double cap_loss, double cap_norm,
                        bool cap_overflow, const std::vector<float>& cap_p,
                        const std::vector<float>& cap_m, double tol) {
  StepCheck c;
  if (eager_overflow != cap_overflow) {
    c.difference =
        str("the overflow verdict (eager ", eager_overflow, ", captured ", cap_overflow, ")");
    return c;
  }
  // An fp16 step whose forward overflowed has a loss of inf or NaN both ways: alike.
  const bool both_off = eager_overflow && !std::isfinite(eager_loss) && !std::isfinite(cap_loss);
  if (!both_off && !(relative(cap_loss, eager_loss) <= tol)) {
    c.difference = str("the loss (eager ", eager_loss, ", captured ", cap_loss,
                       ": relative difference ", fmt_sci(relative(cap_loss, eager_loss)),
                       ", allowed ", fmt_sci(tol), ")");
    return c;
  }
  if (eager_overflow) {
    // Skipped both ways: the weights and momentum are as before in both, and nothing else
    // can be compared.
    if (cap_p != eager_p || cap_m != eager_m)
      c.difference = "the weights or momentum of a step skipped for overflow (changed when captured)";
    else
      c.inconclusive = true;
    return c;
  }
  if (!(relative(cap_norm, eager_norm) <= tol)) {
    c.difference = str("the gradient norm (eager ", eager_norm, ", captured ", cap_norm,
                       ": relative difference ", fmt_sci(relative(cap_norm, eager_norm)),
                       ", allowed ", fmt_sci(tol), ")");
    return c;
  }
  // The momentum buffers hold each parameter's gradient (SGD: m = momentum * m + g; LARS's
  // with the rate in it) in fp32 whatever the weight's size: compared whole. The weights
  // are compared for what the buffers do not show (the rate and the scales each replay takes
  // from its inputs), within an ulp of each weight: a warm-up rate makes an update a few ulps
  // of its weight, and gradients that differ by rounding then move it by one.
  const double em = normalized_difference(cap_m, eager_m);
  if (!(em <= tol)) {
    c.difference = str("the momentum buffers (normalized difference ", fmt_sci(em), ", allowed ",
                       fmt_sci(tol), ")");
    return c;
  }
  const double ew = update_difference(before, eager_p, cap_p);
  if (!(ew <= tol))
    c.difference = str("the weights' update (beyond an ulp of each weight: normalized "
                       "difference ", fmt_sci(ew), ", allowed ", fmt_sci(tol), ")");
  return c;
}

}  // namespace

void StepRunner::record_checked(const Tensor& x, const int32_t* labels, float lr,
                                float label_smoothing, double scale, const LabelMix* mix) {
  const StepState before = save_state();
  // The reference: this very step, eager, read back as any eager step (a loss that is not
  // finite ends the run here as it would without capture).
  queue_after_forward(model_.forward(x, /*training=*/true), labels, lr, label_smoothing, scale, mix,
                      nullptr, 0.0);
  const StepFigures eager = read_figures(scale, /*accepted=*/true);
  restore_state(before);
  if (record(x, labels, lr, label_smoothing, scale, mix)) {
    const StepInputs in{labels, mix, x.dim(0), lr, float(scale), float(1.0 / (scale * double(units_)))};
    // Read unchecked: a replay that fails, or gives a loss that is not finite, is the check's
    // finding, not the run's end.
    std::string error;
    StepFigures cap;
    try {
      replay(x, in, /*recorded_now=*/true);
      cap = read_figures(scale, /*accepted=*/false);
    } catch (const std::exception& e) {
      error = e.what();
    }
    // A step's results come out of convolutions' gradients: the bound of a convolution.
    const double tol = fast_path_tolerance(OpKind::conv, op_precision_);
    if (!error.empty()) {
      // Not kept as a verdict: the path could not run here (out of memory, say), which says
      // nothing of what it computes; a restart tries again.
      log_info(str("warning: captured steps: the recorded step's first replay failed (", error,
                   "); this step runs again as it comes, and so do the rest"));
      stop_capturing("its first replay failed: " + error);
    } else {
      const StepCheck c = compare_steps(
          before.host_params, eager.result.loss.loss, eager.grad_norm, eager.result.overflow,
          eager.params, eager.momentum, cap.result.loss.loss, cap.grad_norm, cap.result.overflow,
          cap.params, cap.momentum, tol);
      if (c.difference.empty() && !c.inconclusive) {
        accept(cap.result);
        fast_path_checks().passed(kFastPathCapture, str("loss ", cap.result.loss.loss,
                                                        ", gradient norm ", cap.grad_norm,
                                                        " as the eager step's"));
        return;
      }
      if (c.inconclusive) {
        if (!told_overflowed_check_)
          log_info("captured steps: the checked step overflowed both ways (skipped), so no update "
                   "was compared; it runs again as it comes, and the next step is recorded and "
                   "checked");
        told_overflowed_check_ = true;
        drop_recording();
      } else {
        fast_path_checks().failed(kFastPathCapture,
                                  str("a captured step differs from the eager step it was "
                                      "recorded from in ", c.difference,
                                      "; steps run as they come"));
        stop_capturing("its first-use check failed: " + c.difference);
      }
    }
  }
  restore_state(before);
  // Eager, from the state before: recording failed (logged), its replay did, or the check did.
  queue_after_forward(model_.forward(x, /*training=*/true), labels, lr, label_smoothing, scale, mix,
                      nullptr, 0.0);
  queued_ = true;
  queued_scale_ = scale;
  read_back();
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
  accept(take_queued());
}

StepResult StepRunner::take_queued() {
  queued_ = false;
  Backend& be = model_.backend();
  StepResult r;
  r.loss_scale = queued_scale_;
  r.comm_wait = queued_wait_;
  if (sync_) r.device_compute = be.step_span_seconds();
  r.loss = be.queued_loss();
  if (micro_loss_.rows > 0) {  // a step of several micro-batches: the figures of all of them
    add_micro_loss(r.loss, micro_rows_);
    r.loss = LossResult{micro_loss_.loss_sum / double(micro_loss_.rows), micro_loss_.top1,
                        micro_loss_.top5};
    micro_loss_ = MicroLoss{};
  }
  if (scaler_.enabled()) r.overflow = be.queued_overflow();
  r.done_at = now_seconds();
  return r;
}

void StepRunner::accept(const StepResult& r) {
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
  SPOTRAIN_CHECK(micro_ == 0, "internal: StepRunner::run on micro-batch ", micro_, " of ", accum_,
                 "; queue() the micro-batches before a step's last");
  settle();
  return take_results().back();
}

StepResult StepRunner::run_uploaded(const Tensor& x, const int32_t* labels, float lr,
                                    float label_smoothing, StepTimes* times,
                                    const LabelMix* mix) {
  queue_uploaded(x, labels, lr, label_smoothing, times, mix);
  SPOTRAIN_CHECK(micro_ == 0, "internal: StepRunner::run_uploaded on micro-batch ", micro_, " of ",
                 accum_, "; queue_uploaded() the micro-batches before a step's last");
  settle();
  return take_results().back();
}

}  // namespace spotrain
