// One training step, in one place: upload the batch in the compute dtype -> forward ->
// softmax cross-entropy (times the loss scale) -> backward -> unscale + overflow verdict ->
// SGD on the fp32 master weights (skipped on the device on overflow) -> loss-scaler update.
// On a GPU a queued step's loss and verdict are read back during the next step, once its
// forward is queued, so the GPU never waits for the host inside a step. With use_captured_steps()
// (train's and bench's default, --cuda-graph) a GPU records one step as a CUDA Graph and replays
// it. With gradient accumulation (set_accum_steps(K)) a step is K micro-batches, each queued by
// its own queue(): each its own forward (batch norm on its own statistics; the first alone
// updates the running statistics, as rank 0 of K ranks) and backward, the
// gradients summed (engine/model.h's rule), the all-reduce overlapping the last one's backward,
// one overflow verdict and one update. The Trainer and `spotrain bench` both run steps through
// here.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/fast_paths.h"
#include "engine/fusion_choice.h"
#include "engine/grad_sync.h"
#include "engine/loss_scaler.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "engine/precision.h"
#include "kernels/step_capture.h"

namespace spotrain {

struct StepTimes {  // seconds, with the device synchronized between phases
  double data = 0, forward = 0, backward = 0, comm_exposed = 0, optimizer = 0;
  // A replayed captured step cannot be split into phases: all of it is here, the rest 0.
  double captured = 0;
  double total() const { return data + forward + backward + comm_exposed + optimizer + captured; }
};

struct StepResult {
  LossResult loss;
  bool overflow = false;  // fp16: the step was skipped
  double loss_scale = 1;
  // When the step's figures were read back (now_seconds()): the end of its queue() on the CPU,
  // about when the device finished it on a GPU.
  double done_at = 0;
  // Seconds the host waited for the ranks' gradient sum in this step: the time a faster rank
  // spends waiting for the slowest (observe/rank_watch.h takes it out of the rank's own time).
  double comm_wait = 0;
  // With several ranks on a device that runs ahead of the host: the step's forward and
  // backward on the device's clock (Backend::step_span_seconds), in place of what the host's
  // clock sees; -1 elsewhere.
  double device_compute = -1;
};

class StepRunner {
 public:
  // With a GradSync, gradients are summed over `world` ranks during backward, and the step
  // waits for that before the update.
  StepRunner(Model& model, Sgd& sgd, LossScaler& scaler, Precision precision,
             GradSync* sync = nullptr, int world = 1);

  // Queues one step. images: host fp32 NHWC (N, C, H, W), or 8-bit pixels that `norm`
  // normalizes on the device (Backend::upload_pixels); labels: N on the host; mix:
  // mixup/cutmix targets for the loss (null: plain labels). The step before's loss and
  // overflow verdict are read back once this step's forward is queued (the loss scale of
  // this step depends on that verdict); this step's wait for the next queue() or settle().
  // With accum_steps() K > 1 each call queues one micro-batch of the step (its first reads the
  // step before back; each later one the loss of the micro-batch before it, once its own
  // forward is queued), and the K-th completes the step; `times` is then the same StepTimes
  // for all K, which the first resets and each adds to; the update takes the last one's lr.
  void queue(const Tensor& images, const int32_t* labels, float lr, float label_smoothing,
             StepTimes* times = nullptr, const LabelMix* mix = nullptr,
             const PixelNorm* norm = nullptr);
  // The same on a batch already uploaded (Backend::upload_images in compute_dtype()), e.g.
  // synthetic data generated once on the device; times->data is 0.
  void queue_uploaded(const Tensor& x, const int32_t* labels, float lr, float label_smoothing,
                      StepTimes* times = nullptr, const LabelMix* mix = nullptr);
  // Waits for the last queued step and reads back its figures: before a checkpoint (the
  // optimizer and loss-scaler state then match the weights) and at an epoch's end.
  void settle();
  // The figures read back since the last call, oldest first. Throws Error when a loss read
  // back was not finite (outside an fp16 overflow) or fp16 overflowed too often in a row.
  std::vector<StepResult> take_results();

  // One step, waited for: queue + settle, returning its figures (tests, bench, the
  // consumer example). With accum_steps() K > 1: the step's last micro-batch, the K - 1
  // before it queued with queue().
  StepResult run(const Tensor& images, const int32_t* labels, float lr, float label_smoothing,
                 StepTimes* times = nullptr, const LabelMix* mix = nullptr,
                 const PixelNorm* norm = nullptr);
  StepResult run_uploaded(const Tensor& x, const int32_t* labels, float lr, float label_smoothing,
                          StepTimes* times = nullptr, const LabelMix* mix = nullptr);
  DType compute_dtype() const { return dtype_; }
  // Whether a step's figures wait for the next queue() (the default on a GPU, which then
  // never waits for the host) or are read at the end of its own (the CPU's default: its
  // backend computes at once, so waiting gains nothing and progress lines come a step late).
  void defer_read_back(bool on) { defer_ = on; }

  // Gradient accumulation (--accum-steps) and this rank's share of the global batch
  // (run/global_batch.h): K micro-batches per step on this rank, K >= 1 (default 1), of
  // `units` micro-batches over all ranks (0: world x K, an even split). The summed gradient is
  // scaled by 1 / units, so every micro-batch weighs the same whichever rank trains it: K
  // micro-batches on one rank train as K ranks with those batches do, and ranks with shares of
  // 5, 5 and 2 as three with 4 each (up to the order of the sum). Set between steps. K > 1 runs
  // steps as they come (not captured); returns why captured steps, asked for before, now stop
  // ("" when none were).
  std::string set_accum_steps(int k, int64_t units = 0);
  int accum_steps() const { return accum_; }
  int64_t step_micro_batches() const { return units_; }  // units: over all ranks
  // Micro-batches of the current step queued so far (0 between steps).
  int micro_batches_queued() const { return micro_; }

  // From the (kEagerBeforeCapture + 1)th step on, each step is one replay of a step recorded
  // then (CUDA Graphs; --cuda-graph, on by default): the kEagerBeforeCapture eager steps before
  // it, of the same batch shape, choose the kernels and size every buffer. A batch of another shape (or with mixed targets where the recorded step
  // had none, or the reverse) runs as it comes, logged once. The step before is read back ahead
  // of each replay, as a step's loss scale and inputs go into the replay. Returns why steps will
  // run as they come instead ("" when they will be captured): the backend cannot record them
  // (the CPU), or several ranks train. A step that cannot be recorded is logged as a warning,
  // and training goes on without capture (capture_failure()). With accum_steps() > 1 the
  // micro-batches run as they come (set_accum_steps).
  std::string use_captured_steps();
  // Whether steps are to be, or are being, captured (use_captured_steps() took, no recording
  // failed).
  bool capturing() const { return capture_; }
  bool captured() const { return graph_x_.defined(); }  // a recorded step is being replayed
  // Why recording the step failed ("" when it did not): the steps then ran as they came.
  const std::string& capture_failure() const { return capture_failure_; }
  static constexpr int kEagerBeforeCapture = 2;

  // The first-use checks of the fast paths and their verdicts (engine/fast_paths.h): the
  // first recorded step is checked against an eager step of the same batch from the same
  // state (the loss, the gradient norm, the momentum buffers and the weights within an ulp),
  // the first 8-bit batch's upload against its fp32 normalization, --fusion auto's chains as
  // they are timed. A recorded step whose replay fails (an error, or a loss that is not
  // finite) runs eagerly again and the run goes on; a check of an fp16 step that overflowed
  // both ways compares no update: the step is recorded and checked again at the next step.
  // Without a call, the runner keeps its verdicts in memory only. `c` outlives the runner.
  void set_fast_path_checks(FastPathChecks* c) { checks_ = c; }
  FastPathChecks& fast_path_checks() { return checks_ ? *checks_ : own_checks_; }

  // --fusion auto: the first step's batch first times the model's fused chains both ways and
  // keeps each fused only where it wins (engine/fusion_choice.h), logged in one line.
  void choose_fusion_at_first_step() { choose_fusion_ = true; }
  // The verdicts, once made (empty before, and without --fusion auto).
  const std::vector<FusionVerdict>& fusion_verdicts() const { return fusion_verdicts_; }

 private:
  void read_back();  // the queued step's figures, if one is queued: take_queued, then accept
  // The queued step's figures as the backend has them, unchecked (nothing is queued after).
  StepResult take_queued();
  // A step's figures taken as the run's: the finite-loss check (throws Error), the update
  // counted, the loss scaler told the verdict (throws after too many overflows in a row).
  void accept(const StepResult& r);
  // Everything of a step after its forward (started at t1 for the times): loss, backward,
  // the ranks' sum, unscale and the update.
  void queue_after_forward(const Tensor& logits, const int32_t* labels, float lr,
                           float label_smoothing, double scale, const LabelMix* mix,
                           StepTimes* times, double t1);
  // How a step runs: as it comes, recorded (and then replayed), or replayed.
  enum class Route { eager, record, replay };
  Route route_for(const Tensor& x, const LabelMix* mix);
  // Records the step on graph_x_ (a copy of x); false, with the capture turned off, when it
  // cannot be recorded.
  bool record(const Tensor& x, const int32_t* labels, float lr, float label_smoothing,
              double scale, const LabelMix* mix);
  // Queues the recorded step on x's values; `recorded_now`: the recording counted the update.
  void replay(const Tensor& x, const StepInputs& in, bool recorded_now);
  // Turns captured steps off for the run: what was recorded goes, `why` is kept.
  void stop_capturing(const std::string& why);
  // Lets the recorded step go; capturing() stays as it was (the next step of the recorded
  // shape is recorded again).
  void drop_recording();

  // The first recording, checked: an eager step of x from the state before, then the state
  // restored, the step recorded and replayed, and the two compared. Where they differ the
  // captured steps go off (and the verdict is kept); where the replay fails they go off for
  // this run; where an fp16 step overflowed both ways the recording goes and the next step is
  // recorded and checked again. In all three the step runs eagerly again from the state before.
  void record_checked(const Tensor& x, const int32_t* labels, float lr, float label_smoothing,
                      double scale, const LabelMix* mix);
  // What the step's check compares and restores.
  struct StepState {
    Tensor params, momentum, buffers;  // device copies
    std::vector<float> host_params;    // the weights before, to compare the updates
    int64_t sgd_steps = 0;
    LossScalerState scaler;
    size_t results = 0;
  };
  struct StepFigures {
    StepResult result;
    double grad_norm = 0;
    std::vector<float> params, momentum;  // after the step
  };
  StepState save_state();
  void restore_state(const StepState& s);
  // Takes the queued step's figures (of `scale`): through read_back's checks where `accepted`
  // (an eager step's, as the run would take it), else unchecked (take_queued: a replay whose
  // loss may not be finite, or whose figures the check may refuse).
  StepFigures read_figures(double scale, bool accepted);
  // Eager steps: the 8-bit upload, checked on its first batch against the host's
  // normalization and turned off where they differ.
  Tensor upload(const Tensor& images, const PixelNorm* norm);

  // The update after the step's gradients are summed: unscale (fp16) and the optimizer step,
  // the sum scaled by 1 / units_.
  void queue_update(float lr, double scale);
  // One micro-batch of a step of accum_ > 1 (queue_uploaded's part for them).
  void queue_micro_batch(const Tensor& x, const int32_t* labels, float lr, float label_smoothing,
                         StepTimes* times, const LabelMix* mix, double t0);
  // The micro-batches' losses, each read back during the next: summed into micro_loss_.
  void add_micro_loss(const LossResult& l, int64_t rows);
  // The GradListener of a step's last micro-batch: adds the earlier micro-batches' sum into
  // each parameter's gradient as backward completes it, then tells the all-reduce.
  class AccumulatingListener;

  Model& model_;
  Sgd& sgd_;
  LossScaler& scaler_;
  DType dtype_;
  OpPrecision op_precision_;  // whose op suite bounds the first-use checks take (fast_paths.h)
  GradSync* sync_;
  int world_;
  bool queued_ = false;      // a step whose figures are not read yet
  double queued_scale_ = 1;  // its loss scale
  double queued_wait_ = 0;   // its wait for the gradient sum (StepResult::comm_wait)
  std::vector<StepResult> results_;
  bool defer_;              // defer_read_back()
  bool capture_ = false;    // use_captured_steps()
  Shape warm_shape_;        // before the recording: the batch shape of the eager steps in a
  bool warm_mixed_ = false; // row, with or without mixed targets,
  int warm_steps_ = 0;      // and how many ran
  Tensor graph_x_;          // the captured step's batch (each replay's is copied there)
  bool graph_mixed_ = false;      // whether it was recorded with mixed targets
  bool told_other_batch_ = false; // a batch unlike graph_x_ was logged
  std::string capture_failure_;
  bool told_overflowed_check_ = false;  // an fp16 check that compared no update was logged
  FastPathChecks* checks_ = nullptr;              // set_fast_path_checks()
  FastPathChecks own_checks_{"", ""};             // used without one
  bool choose_fusion_ = false;  // choose_fusion_at_first_step(), not done yet
  std::vector<FusionVerdict> fusion_verdicts_;
  // Gradient accumulation (set_accum_steps).
  int accum_ = 1;            // micro-batches per step
  int64_t units_;            // micro-batches per step over all ranks (the gradient's divisor)
  int micro_ = 0;            // of the current step, queued so far
  double micro_scale_ = 1;   // the current step's loss scale, for all its micro-batches
  Tensor grad_sum_;          // (P) fp32: the gradients of the step's micro-batches before the last
  struct MicroLoss {         // the losses of those micro-batches (rows-weighted)
    double loss_sum = 0;
    int64_t rows = 0, top1 = 0, top5 = 0;
  };
  MicroLoss micro_loss_;     // of the queued step's micro-batches read back so far
  int64_t micro_rows_ = 0;   // rows of the micro-batch whose loss is queued
};

}  // namespace spotrain
