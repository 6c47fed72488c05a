// One training step (engine/step.h, StepRunner) on the CPU backend: an fp16 step that overflows
// leaves weights and momentum untouched and halves the scale; steps whose figures are read a
// step late (as on a GPU) equal steps read at once, bit for bit; a loss that is not finite
// stops at its read-back; the CPU reads each step back at once; a static loss scale is kept
// end to end, and one that always overflows stops training; captured steps' routes (eager,
// recorded, replayed, a batch of another shape, a refused recording) with a stand-in recorder.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/philox.h"
#include "core/environment.h"
#include "engine/fast_paths.h"
#include "engine/loss_scaler.h"
#include "engine/step.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/ops.h"
#include "kernels/step_capture.h"
#include "layers/fusion_chain.h"
#include "fmnist_resnet.h"
#include "layers/resnet.h"
#include "run/trainer.h"
#include "step_reference.h"

using namespace spotrain;

namespace {

std::vector<float> host_copy(Backend& be, const Tensor& t) {
  Tensor h = be.to_host(t);
  const float* p = h.data<float>();
  return std::vector<float>(p, p + h.numel());
}

}  // namespace

// ---- one fp16 training step that overflows -------------------------------------------------

namespace {

// One step of resnet20 on 64 synthetic images in batches of 16 on the CPU at `precision`
// ("fp16", "fp32"), quiet and without a run folder.
RunConfig small_config(const std::string& precision) {
  RunConfig cfg;
  cfg.model = "resnet20";
  cfg.data = "synthetic";
  cfg.train_limit = 64;
  cfg.test_limit = 32;
  cfg.batch_size = 16;
  cfg.steps = 1;
  cfg.precision = precision;
  cfg.ckpt_dir = "";
  cfg.device = "cpu";
  cfg.log_every = 1000;
  cfg.eval_each_epoch = false;
  return cfg;
}

struct Batch {
  Tensor images;  // (N, C, H, W) host fp32 NHWC
  std::vector<int32_t> labels;
};

Batch random_batch(int64_t n, uint64_t seed) {
  Batch b;
  b.images = Tensor::host({n, 1, 28, 28}, DType::f32, Layout::nhwc);
  Philox rng(seed);
  float* p = b.images.data<float>();
  for (int64_t i = 0; i < b.images.numel(); ++i) p[i] = rng.normal();
  for (int64_t i = 0; i < n; ++i) b.labels.push_back(int32_t(rng.below(10)));
  return b;
}

LossScaler make_scaler(double init_scale) {
  LossScalerOptions o;
  o.enabled = true;
  o.init_scale = init_scale;
  return LossScaler(o);
}

}  // namespace

TEST(Fp16Step, OverflowSkipsTheUpdateAndHalvesTheScale) {
  Trainer t(small_config("fp16"));
  Model& model = t.model();
  Sgd& sgd = t.optimizer();
  Backend& be = t.backend();
  Batch b = random_batch(16, 21);

  // 1. Scale 2^40: the scaled gradient overflows fp16 in the first activation gradient.
  LossScaler huge = make_scaler(std::ldexp(1.0, 40));
  std::vector<float> p0 = host_copy(be, model.flat_params()), m0 = host_copy(be, sgd.momentum());
  StepResult r = StepRunner(model, sgd, huge, Precision::fp16).run(b.images, b.labels.data(), 0.1f, 0.f);
  EXPECT_TRUE(r.overflow);
  EXPECT_EQ(r.loss_scale, std::ldexp(1.0, 40));
  EXPECT_TRUE(std::isfinite(r.loss.loss));
  std::vector<float> p1 = host_copy(be, model.flat_params()), m1 = host_copy(be, sgd.momentum());
  ASSERT_EQ(p1.size(), p0.size());
  EXPECT_EQ(std::memcmp(p0.data(), p1.data(), p0.size() * 4), 0) << "params changed on overflow";
  EXPECT_EQ(std::memcmp(m0.data(), m1.data(), m0.size() * 4), 0) << "momentum changed on overflow";
  EXPECT_EQ(sgd.steps(), 0);
  EXPECT_EQ(huge.scale(), std::ldexp(1.0, 39));
  EXPECT_EQ(huge.state().skipped_steps, 1);
  EXPECT_EQ(huge.state().consecutive_overflows, 1);

  // 2. Scale 1024: fits; the step is applied.
  LossScaler fits = make_scaler(1024);
  r = StepRunner(model, sgd, fits, Precision::fp16).run(b.images, b.labels.data(), 0.1f, 0.f);
  EXPECT_FALSE(r.overflow);
  EXPECT_EQ(fits.scale(), 1024.0);
  EXPECT_EQ(fits.state().skipped_steps, 0);
  EXPECT_EQ(sgd.steps(), 1);
  std::vector<float> p2 = host_copy(be, model.flat_params()), m2 = host_copy(be, sgd.momentum());
  EXPECT_NE(std::memcmp(p1.data(), p2.data(), p1.size() * 4), 0) << "params did not change";
  int64_t finite = 0, nonzero = 0;
  for (float v : m2) {
    finite += std::isfinite(v);
    nonzero += v != 0.f;
  }
  EXPECT_EQ(finite, int64_t(m2.size()));
  EXPECT_GT(nonzero, int64_t(m2.size()) / 2);

  // 3. Overflow again, now with non-zero momentum: still bitwise untouched.
  LossScaler huge2 = make_scaler(std::ldexp(1.0, 40));
  r = StepRunner(model, sgd, huge2, Precision::fp16).run(b.images, b.labels.data(), 0.1f, 0.f);
  EXPECT_TRUE(r.overflow);
  std::vector<float> p3 = host_copy(be, model.flat_params()), m3 = host_copy(be, sgd.momentum());
  EXPECT_EQ(std::memcmp(p2.data(), p3.data(), p2.size() * 4), 0);
  EXPECT_EQ(std::memcmp(m2.data(), m3.data(), m2.size() * 4), 0);
  EXPECT_EQ(sgd.steps(), 1);
  EXPECT_EQ(huge2.scale(), std::ldexp(1.0, 39));
}

// Steps queued back to back (each one's loss and overflow verdict read during the next, the
// update skipped on the device) against the step written out with every figure read at once:
// the same losses, verdicts and scales, and bitwise the same weights, momentum and counts,
// through a run that both skips and applies steps.
TEST(Fp16Step, QueuedStepsEqualStepsReadAtOnce) {
  Trainer a(small_config("fp16")), q(small_config("fp16"));
  ASSERT_EQ(host_copy(a.backend(), a.model().flat_params()),
            host_copy(q.backend(), q.model().flat_params()));
  LossScaler sa = bouncing_scaler(), sq = bouncing_scaler();
  StepRunner runner(q.model(), q.optimizer(), sq, Precision::fp16);
  runner.defer_read_back(true);  // as on a GPU
  std::vector<StepResult> ra, rq;
  const int kSteps = 40;
  for (int i = 0; i < kSteps; ++i) {
    Batch b = random_batch(16, 500 + uint64_t(i));
    ra.push_back(reference_step(a.model(), a.optimizer(), sa, DType::f16, b.images, b.labels.data(),
                                0.05f, 0.1f));
    runner.queue(b.images, b.labels.data(), 0.05f, 0.1f);
    // Each queue reads back the step before it, and only that one.
    std::vector<StepResult> got = runner.take_results();
    EXPECT_EQ(got.size(), i == 0 ? 0u : 1u) << "step " << i;
    rq.insert(rq.end(), got.begin(), got.end());
  }
  runner.settle();
  for (const StepResult& r : runner.take_results()) rq.push_back(r);
  EXPECT_TRUE(runner.take_results().empty());
  ASSERT_EQ(rq.size(), ra.size());
  const int overflows = expect_same_results(rq, ra);
  // The run both skipped and applied steps, and overflowed again after growing back.
  EXPECT_GT(overflows, 2);
  EXPECT_LT(overflows, kSteps - 10);
  bool skipped_late = false;
  for (int i = kSteps / 2; i < kSteps; ++i) skipped_late |= ra[size_t(i)].overflow;
  EXPECT_TRUE(skipped_late) << "growing back never overflowed again: the test lost its point";
  EXPECT_EQ(host_copy(q.backend(), q.model().flat_params()),
            host_copy(a.backend(), a.model().flat_params()));
  EXPECT_EQ(host_copy(q.backend(), q.optimizer().momentum()),
            host_copy(a.backend(), a.optimizer().momentum()));
  EXPECT_EQ(a.optimizer().steps(), kSteps - overflows);
  EXPECT_EQ(q.optimizer().steps(), a.optimizer().steps());
  EXPECT_EQ(sq.scale(), sa.scale());
  EXPECT_EQ(sq.state().skipped_steps, sa.state().skipped_steps);
  EXPECT_EQ(sq.state().good_steps, sa.state().good_steps);
}

// The premise of the GPU's fp16 step tests (captured against eager, with and without mixed
// targets; tests/test_gpu_steps.cpp), checked where CI runs: from bouncing_scaler's first
// scale, ResNet-20's steps on fmnist_like_batch both skip and apply updates within fourteen
// steps, read a step late as on a GPU. (From 2^40, the first eighteen steps overflowed here as
// on the H200, where such a test then failed with 14 overflows in 14 steps.)
TEST(Fp16Step, TheBouncingScaleBothSkipsAndAppliesWithinFourteenSteps) {
  for (bool mixed : {false, true}) {
    SCOPED_TRACE(mixed ? "mixed targets" : "plain labels");
    // The model of the GPU tests (their make_run), on the CPU backend.
    BackendOptions bo;
    bo.threads = 2;
    std::unique_ptr<Backend> be = make_backend("cpu", bo);
    Model model(build_resnet(fmnist_resnet20()), *be);
    model.initialize(2024);
    Sgd sgd(model, SgdOptions{});
    LossScaler s = bouncing_scaler();
    StepRunner runner(model, sgd, s, Precision::fp16);
    runner.defer_read_back(true);
    const int kSteps = 14;
    const std::vector<StepResult> got = queued_steps(runner, kSteps, 1400, mixed);
    ASSERT_EQ(got.size(), size_t(kSteps));
    int overflows = 0;
    for (const StepResult& r : got) {
      overflows += r.overflow;
      EXPECT_TRUE(std::isfinite(r.loss.loss));
    }
    EXPECT_GT(overflows, 1);
    EXPECT_LT(overflows, kSteps - 4);
    EXPECT_EQ(sgd.steps(), kSteps - overflows);
  }
}

// A loss that is not finite outside an fp16 overflow stops the run when it is read back: at
// the next step or at settle(), before a checkpoint could save the weights it left.
TEST(Fp16Step, NonFiniteLossStopsAtTheReadBack) {
  RunConfig cfg = small_config("fp32");
  Trainer t(cfg);
  LossScaler off{LossScalerOptions{}};
  StepRunner runner(t.model(), t.optimizer(), off, Precision::fp32);
  runner.defer_read_back(true);  // as on a GPU
  Batch b = random_batch(16, 31);
  // NaN weights everywhere: the classifier's logits are NaN whatever the ReLUs do upstream
  // (a NaN pixel alone is zeroed by the first ReLU after batch norm).
  Tensor& params = t.model().flat_params();
  ASSERT_EQ(params.device(), Device::cpu);
  std::fill_n(params.data<float>(), params.numel(), std::numeric_limits<float>::quiet_NaN());
  params.mark_written();
  runner.queue(b.images, b.labels.data(), 0.05f, 0.f);  // read back later: no throw yet
  try {
    runner.settle();
    FAIL() << "a NaN loss must stop the run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("loss became"), std::string::npos) << e.what();
  }
}

// On the CPU (which computes each op at once) a step's figures are read at the end of its own
// queue(): the progress line is not a step late.
TEST(Fp16Step, TheCpuReadsEachStepBackAtOnce) {
  Trainer t(small_config("fp16"));
  LossScaler s = bouncing_scaler();
  StepRunner runner(t.model(), t.optimizer(), s, Precision::fp16);
  for (int i = 0; i < 3; ++i) {
    Batch b = random_batch(16, 700 + uint64_t(i));
    runner.queue(b.images, b.labels.data(), 0.05f, 0.f);
    EXPECT_EQ(runner.take_results().size(), 1u) << "step " << i;
  }
}

TEST(Fp16Step, StaticLossScaleIsHonouredEndToEnd) {
  RunConfig cfg = small_config("fp16");
  cfg.loss_scale = 128;
  cfg.steps = 4;
  Trainer t(cfg);
  EXPECT_EQ(t.scaler().scale(), 128.0);
  std::vector<float> p0 = host_copy(t.backend(), t.model().flat_params());
  TrainResult r = t.run();
  EXPECT_EQ(r.loss_scale, 128.0);
  EXPECT_EQ(r.steps, 4);
  EXPECT_EQ(r.skipped_steps, 0);
  EXPECT_TRUE(std::isfinite(r.final_loss));
  EXPECT_EQ(t.optimizer().steps(), 4);
  std::vector<float> p1 = host_copy(t.backend(), t.model().flat_params());
  EXPECT_NE(std::memcmp(p0.data(), p1.data(), p0.size() * 4), 0);
}

TEST(Fp16Step, StaticScaleThatAlwaysOverflowsStopsTraining) {
  RunConfig cfg = small_config("fp16");
  cfg.loss_scale = std::ldexp(1.0, 40);
  cfg.max_overflow_steps = 3;
  cfg.steps = 10;
  Trainer t(cfg);
  std::vector<float> p0 = host_copy(t.backend(), t.model().flat_params());
  try {
    t.run();
    FAIL() << "training must stop after 3 overflowed steps in a row";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("consecutive"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.scaler().state().skipped_steps, 3);
  EXPECT_EQ(t.scaler().scale(), std::ldexp(1.0, 40));  // static: never backed off
  EXPECT_EQ(t.optimizer().steps(), 0);
  std::vector<float> p1 = host_copy(t.backend(), t.model().flat_params());
  EXPECT_EQ(std::memcmp(p0.data(), p1.data(), p0.size() * 4), 0);
}

TEST(Fp16Step, SameScaleDoesNotOverflowInFp32) {
  // The control for the overflow above: it comes from fp16's range, not from the scaler.
  RunConfig cfg = small_config("fp32");
  Trainer t(cfg);
  Batch b = random_batch(16, 21);
  LossScaler huge = make_scaler(std::ldexp(1.0, 40));
  StepResult r = StepRunner(t.model(), t.optimizer(), huge, Precision::fp32)
                     .run(b.images, b.labels.data(), 0.1f, 0.f);
  EXPECT_FALSE(r.overflow);
  EXPECT_EQ(huge.scale(), std::ldexp(1.0, 40));
  EXPECT_EQ(t.optimizer().steps(), 1);
}


// ---- captured steps: which step is run, recorded or replayed ----------------------------------

namespace {

// The CPU backend with a stand-in recorder that notes each call. The CPU computes its ops as
// they are called, so the "recorded" step is computed then and a "replay" computes nothing:
// what these tests check is the route each step takes, the update count and the fallbacks.
// Its faults, for the first-use check: a replay that throws, one whose loss reads NaN, one
// that does `at_replay` (nudges the weights), and fp16 steps forced to overflow.
class NotingRecorder : public cpu::CpuBackend, public StepCapture {
 public:
  using cpu::CpuBackend::CpuBackend;
  StepCapture* capture() override { return this; }
  void begin_recording(int64_t batch, bool mixed) override {
    calls.push_back(str("begin ", batch, mixed ? " mixed" : ""));
    if (refuse) throw Error("this recorder refuses");
  }
  void end_recording() override { calls.push_back("end"); }
  void abort_recording() override { calls.push_back("abort"); }
  void replay(const StepInputs& in) override {
    calls.push_back(str("replay ", in.n));
    if (fail_replay) throw Error("this recorder's replay fails");
    if (at_replay) at_replay();
    nan_loss_ = nan_loss_ || nan_at_replay;
  }
  void drop() override { calls.push_back("drop"); }
  size_t reserved_bytes() const override { return 0; }
  LossResult queued_loss() override {
    LossResult l = cpu::CpuBackend::queued_loss();
    if (nan_loss_) l.loss = std::nan("");
    nan_loss_ = false;
    return l;
  }

  std::vector<std::string> calls;
  bool refuse = false;
  bool fail_replay = false;
  bool nan_at_replay = false;       // the replayed step's loss reads NaN
  std::function<void()> at_replay;  // done at each replay
  int forced_overflows = 0;         // fp16: this many next steps overflow, their loss NaN

 protected:
  // An overflow as a forward past fp16's range gives one: the verdict true (the update
  // skipped), the loss read back NaN.
  void unscale_check_queue_impl(Tensor& grads, float inv_scale) override {
    cpu::CpuBackend::unscale_check_queue_impl(grads, inv_scale);
    if (forced_overflows == 0) return;
    --forced_overflows;
    queued_overflow_ = true;
    nan_loss_ = true;
  }

 private:
  bool nan_loss_ = false;
};

LossScalerOptions fp16_scaler() {
  LossScalerOptions o;
  o.enabled = true;
  o.init_scale = 1024;
  return o;
}

struct RecorderRun {
  NotingRecorder be{BackendOptions{}};
  Model model{build_resnet(ResNetOptions{}), be};
  Sgd sgd{model, SgdOptions{}};
  LossScaler scaler;
  StepRunner runner;
  float lr = 0.05f;
  explicit RecorderRun(Precision p = Precision::fp32)
      : scaler(p == Precision::fp16 ? fp16_scaler() : LossScalerOptions{}),
        runner(model, sgd, scaler, p) {
    model.initialize(5);
  }

  // Runs one step of n images; whether it changed the weights (the stand-in's replays do not).
  bool step(int64_t n, uint64_t seed) {
    std::vector<float> before = host_copy(be, model.flat_params());
    Batch b = random_batch(n, seed);
    runner.run(b.images, b.labels.data(), lr, 0.f);
    return host_copy(be, model.flat_params()) != before;
  }
};

using Calls = std::vector<std::string>;

// Asks captured steps of `r`, then runs four steps of 8 images (seeds `seed` on) on `r`, none
// throwing, and on `eager` beside it; returns what the steps printed.
std::string four_steps_beside_eager(RecorderRun& r, RecorderRun& eager, uint64_t seed) {
  EXPECT_EQ(r.runner.use_captured_steps(), "");
  testing::internal::CaptureStdout();
  for (int i = 0; i < 4; ++i) {
    EXPECT_NO_THROW(r.step(8, seed + uint64_t(i))) << "step " << i;
    eager.step(8, seed + uint64_t(i));
  }
  return testing::internal::GetCapturedStdout();
}

// `r` ends with the weights and momentum of `eager`, bit for bit.
void expect_same_weights_and_momentum(RecorderRun& r, RecorderRun& eager) {
  EXPECT_EQ(host_copy(r.be, r.model.flat_params()), host_copy(eager.be, eager.model.flat_params()));
  EXPECT_EQ(host_copy(r.be, r.sgd.momentum()), host_copy(eager.be, eager.sgd.momentum()));
}

}  // namespace

TEST(CapturedSteps, EagerStepsThenOneRecordingThenReplaysAndAnotherBatchRunsAsItComes) {
  RecorderRun r;
  EXPECT_EQ(r.runner.use_captured_steps(), "");
  EXPECT_TRUE(r.runner.capturing());
  for (int i = 0; i < StepRunner::kEagerBeforeCapture; ++i) EXPECT_TRUE(r.step(8, 10 + i));
  EXPECT_EQ(r.be.calls, Calls{});
  EXPECT_FALSE(r.runner.captured());
  r.step(8, 20);  // recorded, then replayed on its own batch
  EXPECT_EQ(r.be.calls, (Calls{"begin 8", "end", "replay 8"}));
  EXPECT_TRUE(r.runner.captured());
  EXPECT_FALSE(r.step(8, 21));
  EXPECT_EQ(r.be.calls.back(), "replay 8");
  // Two batches of another size run as they come, said once; the replays go on after them.
  testing::internal::CaptureStdout();
  EXPECT_TRUE(r.step(4, 22));
  EXPECT_TRUE(r.step(4, 23));
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("such steps run as they come"), std::string::npos) << out;
  EXPECT_EQ(out.find("such steps"), out.rfind("such steps")) << out;
  EXPECT_EQ(r.be.calls.size(), 4u);
  EXPECT_FALSE(r.step(8, 24));
  EXPECT_EQ(r.be.calls, (Calls{"begin 8", "end", "replay 8", "replay 8", "replay 8"}));
  EXPECT_EQ(r.sgd.steps(), 7) << "every step, replayed or not, counts once";
  EXPECT_EQ(r.runner.capture_failure(), "");
}

// The recording waits for kEagerBeforeCapture eager steps in a row of the batch it records:
// they chose every kernel it needs.
TEST(CapturedSteps, TheRecordingFollowsEagerStepsOfItsOwnShape) {
  RecorderRun r;
  EXPECT_EQ(r.runner.use_captured_steps(), "");
  const int64_t sizes[] = {8, 4, 8, 8};
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(r.step(sizes[i], 40 + i)) << i;
  EXPECT_EQ(r.be.calls, Calls{});
  r.step(8, 50);
  EXPECT_EQ(r.be.calls, (Calls{"begin 8", "end", "replay 8"}));
}

TEST(CapturedSteps, AStepThatCannotBeRecordedRunsAsItComesAndSoDoTheRest) {
  RecorderRun r;
  r.be.refuse = true;
  EXPECT_EQ(r.runner.use_captured_steps(), "");
  testing::internal::CaptureStdout();
  for (int i = 0; i < StepRunner::kEagerBeforeCapture + 3; ++i) EXPECT_TRUE(r.step(8, 30 + i)) << i;
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("could not be recorded (this recorder refuses)"), std::string::npos) << out;
  EXPECT_EQ(r.be.calls, (Calls{"begin 8", "abort", "drop"}));
  EXPECT_FALSE(r.runner.capturing());
  EXPECT_FALSE(r.runner.captured());
  EXPECT_EQ(r.runner.capture_failure(), "this recorder refuses");
  EXPECT_EQ(r.sgd.steps(), StepRunner::kEagerBeforeCapture + 3);
}

// Where steps cannot be captured, use_captured_steps says why and every step runs as it comes.
TEST(CapturedSteps, ABackendWithoutARecorderOrSeveralRanksSayWhyNot) {
  RecorderRun r;
  StepRunner two(r.model, r.sgd, r.scaler, Precision::fp32, nullptr, /*world=*/2);
  EXPECT_NE(two.use_captured_steps().find("2 ranks"), std::string::npos);
  EXPECT_FALSE(two.capturing());
  Trainer t(small_config("fp16"));
  StepRunner cpu(t.model(), t.optimizer(), r.scaler, Precision::fp32);
  EXPECT_NE(cpu.use_captured_steps().find("runs steps as they come"), std::string::npos);
  EXPECT_FALSE(cpu.capturing());
}

// With micro-batches a step is several forwards and backwards: use_captured_steps says so, and
// asked after capture was taken up (a resume that changed --accum-steps), set_accum_steps
// turns it off with the same reason; the steps run as they come, the recorder never called.
TEST(CapturedSteps, MicroBatchesRunAsTheyComeAndSaySo) {
  RecorderRun a;
  EXPECT_EQ(a.runner.set_accum_steps(2), "");
  EXPECT_NE(a.runner.use_captured_steps().find("--accum-steps 2"), std::string::npos);
  EXPECT_FALSE(a.runner.capturing());
  RecorderRun b;
  EXPECT_EQ(b.runner.use_captured_steps(), "");
  const std::string why = b.runner.set_accum_steps(2);
  EXPECT_NE(why.find("--accum-steps 2: each step's 2 micro-batches run as they come"), std::string::npos) << why;
  EXPECT_FALSE(b.runner.capturing());
  for (int i = 0; i < StepRunner::kEagerBeforeCapture + 2; ++i) {
    Batch first = random_batch(8, 60 + i);
    b.runner.queue(first.images, first.labels.data(), 0.05f, 0.f);
    EXPECT_EQ(b.runner.micro_batches_queued(), 1);
    EXPECT_TRUE(b.step(8, 70 + i)) << i;  // the step's last micro-batch
  }
  EXPECT_EQ(b.be.calls, Calls{});
  EXPECT_EQ(b.sgd.steps(), StepRunner::kEagerBeforeCapture + 2);
}

// ---- gradient accumulation (--accum-steps) ---------------------------------------------------

namespace {

// Two CPU models from the same weights: one trained by a StepRunner with micro-batches, one by
// the rule written out.
struct TwinModels {
  std::unique_ptr<Backend> be = make_backend("cpu", BackendOptions{1, false});
  Model a{build_resnet(ResNetOptions{}), *be}, b{build_resnet(ResNetOptions{}), *be};
  Sgd sgd_a{a, SgdOptions{}}, sgd_b{b, SgdOptions{}};
  TwinModels() {
    a.initialize(9);
    b.initialize(9);
  }
};

}  // namespace

// A step of K = 2 micro-batches on one rank: each micro-batch's forward and backward on its
// own (batch norm on its own statistics, the running statistics moved by both in turn), the
// gradients summed (the last micro-batch's + the earlier one's, each fp32 sum rounded once)
// and the update taking the sum / 2, as two ranks' all-reduce average; the loss is the mean
// over both. The reference is that rule written out with the sum made on the host: bit for bit.
TEST(Accumulation, AStepOfTwoMicroBatchesAppliesTheirSumOverTwo) {
  TwinModels m;
  LossScaler off{LossScalerOptions{}};
  StepRunner runner(m.a, m.sgd_a, off, Precision::fp32);
  EXPECT_EQ(runner.set_accum_steps(2), "");
  EXPECT_EQ(runner.accum_steps(), 2);
  for (int step = 0; step < 3; ++step) {
    StepBatch first = fmnist_like_batch(8, 100 + step), second = fmnist_like_batch(8, 200 + step);
    const float lr = 0.1f - 0.02f * float(step);
    runner.queue(first.images, first.labels.data(), lr, 0.1f);
    const StepResult got = runner.run(second.images, second.labels.data(), lr, 0.1f);
    // The rule, by hand: the first micro-batch's forward alone updates the running statistics
    // (as rank 0 of two ranks keeps its own).
    Backend& be = *m.be;
    LossResult l[2];
    std::vector<float> g[2];
    const StepBatch* mb[2] = {&first, &second};
    for (int j = 0; j < 2; ++j) {
      Tensor dl;
      l[j] = be.softmax_xent(m.b.forward(be.upload_images(mb[j]->images), true, /*update_running=*/j == 0),
                             mb[j]->labels.data(), 0.1f, 1.f, &dl);
      m.b.backward(dl);
      g[j] = host_copy(be, m.b.flat_grads());
    }
    Tensor sum = Tensor::host({m.b.num_params()});
    for (int64_t i = 0; i < sum.numel(); ++i) sum.data<float>()[i] = g[1][size_t(i)] + g[0][size_t(i)];
    be.copy(be.from_host(sum), m.b.flat_grads());
    m.sgd_b.step(lr, 0.5f);

    EXPECT_FALSE(got.overflow);
    EXPECT_DOUBLE_EQ(got.loss.loss, (l[0].loss * 8 + l[1].loss * 8) / 16) << "step " << step;
    EXPECT_EQ(got.loss.top1, l[0].top1 + l[1].top1);
    EXPECT_EQ(host_copy(be, m.a.flat_params()), host_copy(be, m.b.flat_params())) << "step " << step;
    EXPECT_EQ(host_copy(be, m.sgd_a.momentum()), host_copy(be, m.sgd_b.momentum())) << "step " << step;
    EXPECT_EQ(host_copy(be, m.a.flat_buffers()), host_copy(be, m.b.flat_buffers())) << "step " << step;
  }
  EXPECT_EQ(m.sgd_a.steps(), 3);
}

// fp16: one overflow verdict per step, over the sum of its micro-batches. A micro-batch holding
// a pixel fp16 cannot hold (inf once uploaded) poisons the sum, first or last: the whole step is
// skipped (weights and momentum bit for bit as before, the scale halved once, one skipped step),
// where the same micro-batch with a finite pixel leaves the step applied.
TEST(Accumulation, Fp16OverflowInOneMicroBatchSkipsTheWholeStep) {
  Trainer t(small_config("fp16"));
  Model& model = t.model();
  Sgd& sgd = t.optimizer();
  Backend& be = t.backend();
  for (bool bad_first : {true, false}) {
    LossScaler scaler = make_scaler(1024);
    StepRunner runner(model, sgd, scaler, Precision::fp16);
    runner.set_accum_steps(2);
    Batch good = random_batch(16, 31), bad = random_batch(16, 32);
    bad.images.data<float>()[5] = 1e6f;  // beyond fp16's 65504
    const std::vector<float> p0 = host_copy(be, model.flat_params()), m0 = host_copy(be, sgd.momentum());
    const int64_t steps0 = sgd.steps();
    const Batch& one = bad_first ? bad : good;
    const Batch& two = bad_first ? good : bad;
    runner.queue(one.images, one.labels.data(), 0.1f, 0.f);
    StepResult r = runner.run(two.images, two.labels.data(), 0.1f, 0.f);
    EXPECT_TRUE(r.overflow) << "bad micro-batch first: " << bad_first;
    EXPECT_EQ(host_copy(be, model.flat_params()), p0) << "params changed on overflow";
    EXPECT_EQ(host_copy(be, sgd.momentum()), m0) << "momentum changed on overflow";
    EXPECT_EQ(sgd.steps(), steps0);
    EXPECT_EQ(scaler.scale(), 512.0);
    EXPECT_EQ(scaler.state().skipped_steps, 1);
    // The control: the same micro-batches with that pixel finite are applied.
    bad.images.data<float>()[5] = 1.f;
    runner.queue(one.images, one.labels.data(), 0.1f, 0.f);
    r = runner.run(two.images, two.labels.data(), 0.1f, 0.f);
    EXPECT_FALSE(r.overflow);
    EXPECT_TRUE(std::isfinite(r.loss.loss));
    EXPECT_EQ(sgd.steps(), steps0 + 1);
    EXPECT_NE(host_copy(be, model.flat_params()), p0);
    EXPECT_EQ(scaler.state().skipped_steps, 1);
  }
}

// --fusion auto, the default: on the CPU the Trainer keeps every chain apart without timing;
// a StepRunner told to choose times the chains on its first batch, before the first forward,
// and says so in one line.
TEST(FusionAutoStep, TheCpuRunsTheLayersApartAndAFirstStepCanChoose) {
  RunConfig cfg = small_config("fp32");
  ASSERT_EQ(cfg.fusion, "auto");
  Trainer t(cfg);
  const std::vector<FusionChain> chains = fusion_chains(t.model().net());
  ASSERT_EQ(chains.size(), 9u);
  for (const FusionChain& c : chains) EXPECT_FALSE(c.fused()) << c.name();

  LossScaler off{LossScalerOptions{}};
  StepRunner runner(t.model(), t.optimizer(), off, Precision::fp32);
  runner.choose_fusion_at_first_step();
  Batch b = random_batch(8, 60);
  testing::internal::CaptureStdout();
  StepResult r = runner.run(b.images, b.labels.data(), 0.05f, 0.f);
  runner.run(b.images, b.labels.data(), 0.05f, 0.f);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(std::isfinite(r.loss.loss));
  ASSERT_EQ(runner.fusion_verdicts().size(), 9u);
  EXPECT_EQ(out.find("--fusion auto: "), out.rfind("--fusion auto: ")) << "chosen once: " << out;
  EXPECT_NE(out.find("of 9 conv + BN+ReLU + conv chains fused"), std::string::npos) << out;
  for (size_t i = 0; i < chains.size(); ++i) {
    auto& v = runner.fusion_verdicts();
    auto it = std::find_if(v.begin(), v.end(), [&](const FusionVerdict& f) { return f.chain == chains[i].name(); });
    ASSERT_NE(it, v.end());
    EXPECT_EQ(chains[i].fused(), it->fused) << chains[i].name();
  }
}

namespace {

// 8-bit pixels (i * mult + add) % 256 for b's images, whose fp32 values become those pixels
// normalized as fma(pixel, scale, shift) (one channel).
Tensor pixels_of(Batch& b, const PixelNorm& norm, int64_t mult, int64_t add) {
  Tensor px = Tensor::host(b.images.shape(), DType::u8, Layout::nhwc);
  uint8_t* p = static_cast<uint8_t*>(px.write_raw());
  float* f = b.images.data<float>();
  for (int64_t i = 0; i < px.numel(); ++i) {
    p[i] = uint8_t((i * mult + add) % 256);
    f[i] = std::fma(float(p[i]), norm.scale(0), norm.shift(0));
  }
  return px;
}

// Fashion-MNIST's normalization of its one channel.
PixelNorm fmnist_norm() {
  PixelNorm norm;
  norm.mean[0] = 0.2860f;
  norm.std[0] = 0.3530f;
  return norm;
}

// Two steps of 8 images (seeds `seed` and `seed` + 1): `floats` on the images normalized on the
// host, `pixels` on them as 8-bit pixels (pixels_of with `mult` and step * `add`) normalized by
// the upload with `norm`; each step's loss is the same both ways.
void expect_pixel_steps_as_float_steps(StepRunner& floats, StepRunner& pixels, const PixelNorm& norm,
                                       uint64_t seed, int64_t mult, int64_t add) {
  for (int step = 0; step < 2; ++step) {
    Batch b = random_batch(8, seed + uint64_t(step));
    Tensor px = pixels_of(b, norm, mult, step * add);
    StepResult want = floats.run(b.images, b.labels.data(), 0.05f, 0.f);
    StepResult got = pixels.run(px, b.labels.data(), 0.05f, 0.f, nullptr, nullptr, &norm);
    EXPECT_EQ(got.loss.loss, want.loss.loss) << "step " << step;
  }
}

}  // namespace

// A batch of 8-bit pixels with its normalization trains exactly as the same batch normalized
// on the host (the CPU's upload_pixels normalizes as fma(pixel, scale, shift) per channel).
TEST(PixelBatches, EightBitPixelsTrainAsTheirNormalizedFloats) {
  RunConfig cfg = small_config("fp32");
  Trainer a(cfg), u(cfg);
  LossScaler sa{LossScalerOptions{}}, su{LossScalerOptions{}};
  StepRunner ra(a.model(), a.optimizer(), sa, Precision::fp32), ru(u.model(), u.optimizer(), su, Precision::fp32);
  const PixelNorm norm = fmnist_norm();
  expect_pixel_steps_as_float_steps(ra, ru, norm, 70, 13, 29);
  EXPECT_EQ(host_copy(u.backend(), u.model().flat_params()), host_copy(a.backend(), a.model().flat_params()));
  Batch b = random_batch(8, 80);
  Tensor px = Tensor::host(b.images.shape(), DType::u8, Layout::nhwc);
  EXPECT_THROW(ru.run(px, b.labels.data(), 0.05f, 0.f), Error);  // pixels without their normalization
}

// ---- first-use checks of the fast paths (engine/fast_paths.h) ----------------------------------

namespace {

// Plants a wrong op (its output doubled: core/environment.h) for as long as it lives; a
// Session made meanwhile wraps its backend so that the op computes wrong.
struct PlantedWrongOp {
  explicit PlantedWrongOp(const char* op) { test_hooks_for_test().wrong_ops = {op}; }
  ~PlantedWrongOp() { test_hooks_for_test().wrong_ops.clear(); }
};

// A stand-in recorder whose recorded step computes with a wrong convolution (its output
// doubled while recording): the captured step then differs from the eager step it was
// recorded from.
class WrongRecorder : public NotingRecorder {
 public:
  using NotingRecorder::NotingRecorder;
  void begin_recording(int64_t batch, bool mixed) override {
    NotingRecorder::begin_recording(batch, mixed);
    recording_ = true;
  }
  void end_recording() override {
    recording_ = false;
    NotingRecorder::end_recording();
  }

 protected:
  Tensor conv2d_forward_impl(const Tensor& x, const Tensor& w, const ConvParams& p) override {
    Tensor y = NotingRecorder::conv2d_forward_impl(x, w, p);
    return recording_ ? add_forward_impl(y, y, false) : y;
  }

 private:
  bool recording_ = false;
};

}  // namespace

// The first recording is checked against an eager step of the same batch from the same state:
// alike, the captured steps go on, and the run trains as one whose steps all ran as they come.
TEST(FastPathChecks, ACapturedStepLikeItsEagerStepStaysOn) {
  RecorderRun r, eager;
  EXPECT_EQ(r.runner.use_captured_steps(), "");
  for (int i = 0; i < 3; ++i) {
    r.step(8, 60 + uint64_t(i));
    eager.step(8, 60 + uint64_t(i));
  }
  EXPECT_EQ(r.be.calls, (Calls{"begin 8", "end", "replay 8"}));
  EXPECT_TRUE(r.runner.fast_path_checks().checked(kFastPathCapture));
  EXPECT_FALSE(r.runner.fast_path_checks().off(kFastPathCapture));
  EXPECT_TRUE(r.runner.captured());
  EXPECT_EQ(r.sgd.steps(), 3);
  expect_same_weights_and_momentum(r, eager);
}

// A captured step that computes something else is caught on its first use: captured steps go
// off for the run with one warning naming the difference, the step is run again eagerly from
// the state before, and the run trains exactly as one that never captured.
TEST(FastPathChecks, ACapturedStepThatDiffersIsTurnedOffAndTheStepRunsEagerly) {
  WrongRecorder be{BackendOptions{}};
  Model model{build_resnet(ResNetOptions{}), be};
  model.initialize(5);
  Sgd sgd{model, SgdOptions{}};
  LossScaler scaler{LossScalerOptions{}};
  StepRunner runner{model, sgd, scaler, Precision::fp32};
  RecorderRun eager;
  EXPECT_EQ(runner.use_captured_steps(), "");
  testing::internal::CaptureStdout();
  for (int i = 0; i < 4; ++i) {
    Batch b = random_batch(8, 90 + uint64_t(i));
    runner.run(b.images, b.labels.data(), 0.05f, 0.f);
    eager.step(8, 90 + uint64_t(i));
  }
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("warning: captured-steps turned off"), std::string::npos) << out;
  EXPECT_NE(out.find("differs from the eager step"), std::string::npos) << out;
  EXPECT_EQ(out.find("turned off"), out.rfind("turned off")) << "one warning: " << out;
  EXPECT_EQ(be.calls, (Calls{"begin 8", "end", "replay 8", "drop"}));
  EXPECT_FALSE(runner.capturing());
  EXPECT_TRUE(runner.fast_path_checks().off(kFastPathCapture));
  EXPECT_NE(runner.capture_failure().find("first-use check"), std::string::npos);
  EXPECT_EQ(sgd.steps(), 4);
  EXPECT_EQ(host_copy(be, model.flat_params()), host_copy(eager.be, eager.model.flat_params()));
  EXPECT_EQ(host_copy(be, model.flat_buffers()), host_copy(eager.be, eager.model.flat_buffers()));
}

// A verdict kept in the run folder holds for a restart on the same device (the path is not
// tried again) and not on another device; a broken file is a warning and is rewritten.
TEST(FastPathChecks, AFailedVerdictIsKeptForARestartOnTheSameDevice) {
  const std::string dir = ::testing::TempDir() + "/spotrain_fast_paths";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/fast-paths.json";
  {
    FastPathChecks c(file, "GPU A");
    testing::internal::CaptureStdout();
    c.failed(kFastPathCapture, "the loss (eager 2.3, captured 4.6)");
    testing::internal::GetCapturedStdout();
    EXPECT_TRUE(c.off(kFastPathCapture));
    EXPECT_FALSE(c.off(kFastPathFusion));
  }
  FastPathChecks again(file, "GPU A"), other(file, "GPU B");
  EXPECT_TRUE(again.off(kFastPathCapture));
  EXPECT_NE(again.why_off(kFastPathCapture).find("captured 4.6"), std::string::npos);
  EXPECT_FALSE(other.off(kFastPathCapture));
  // The runner of a restart does not record at all, and says why.
  RecorderRun r;
  r.runner.set_fast_path_checks(&again);
  EXPECT_NE(r.runner.use_captured_steps().find("first-use check"), std::string::npos);
  EXPECT_FALSE(r.runner.capturing());
  {
    std::ofstream(file) << "{ not json";
  }
  testing::internal::CaptureStdout();
  FastPathChecks broken(file, "GPU A");
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("cannot be read"), std::string::npos) << out;
  EXPECT_FALSE(broken.off(kFastPathCapture));
}

// The 8-bit upload is checked on its first batch against the same images normalized on the
// host: a wrong upload goes off with one warning, and the batches are then normalized on the
// host, so the run trains as on the normalized floats.
TEST(FastPathChecks, AnEightBitUploadThatDiffersIsTurnedOff) {
  RunConfig cfg = small_config("fp32");
  Trainer a(cfg);
  PlantedWrongOp wrong("upload_pixels");  // u's session is made with the op planted: wrapped
  Trainer u(cfg);
  LossScaler sa{LossScalerOptions{}}, su{LossScalerOptions{}};
  StepRunner ra(a.model(), a.optimizer(), sa, Precision::fp32), ru(u.model(), u.optimizer(), su, Precision::fp32);
  const PixelNorm norm = fmnist_norm();
  testing::internal::CaptureStdout();
  expect_pixel_steps_as_float_steps(ra, ru, norm, 170, 17, 31);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("warning: 8-bit-upload turned off"), std::string::npos) << out;
  EXPECT_TRUE(ru.fast_path_checks().off(kFastPathPixels));
  EXPECT_EQ(host_copy(u.backend(), u.model().flat_params()), host_copy(a.backend(), a.model().flat_params()));
}

// Without a planted fault the 8-bit upload passes its check and stays on.
TEST(FastPathChecks, AnEightBitUploadThatMatchesStaysOn) {
  RunConfig cfg = small_config("fp32");
  Trainer u(cfg);
  LossScaler su{LossScalerOptions{}};
  StepRunner ru(u.model(), u.optimizer(), su, Precision::fp32);
  PixelNorm norm;
  Batch b = random_batch(8, 180);
  Tensor px = Tensor::host(b.images.shape(), DType::u8, Layout::nhwc);
  uint8_t* p = static_cast<uint8_t*>(px.write_raw());
  for (int64_t i = 0; i < px.numel(); ++i) p[i] = uint8_t((i * 7) % 256);
  ru.run(px, b.labels.data(), 0.05f, 0.f, nullptr, nullptr, &norm);
  EXPECT_TRUE(ru.fast_path_checks().checked(kFastPathPixels));
  EXPECT_FALSE(ru.fast_path_checks().off(kFastPathPixels));
}

// ---- the capture check's own faults (issue 54: it must neither stop the run nor turn a correct
// path off for good) ----------------------------------------------------------------------------

// A replayed step whose loss is not finite at fp32 is what the check is for: it must not end
// the run at the read-back's finite-loss check. Captured steps go off with one warning naming
// the loss, the step runs eagerly again from the state before, and the run trains as one that
// never captured.
TEST(CaptureCheck, AReplayWhoseLossIsNotFiniteRunsEagerlyAndTheRunGoesOn) {
  RecorderRun r, eager;
  r.be.nan_at_replay = true;
  const std::string out = four_steps_beside_eager(r, eager, 300);
  EXPECT_NE(out.find("warning: captured-steps turned off"), std::string::npos) << out;
  EXPECT_NE(out.find("captured nan"), std::string::npos) << out;
  EXPECT_EQ(r.be.calls, (Calls{"begin 8", "end", "replay 8", "drop"}));
  EXPECT_TRUE(r.runner.fast_path_checks().off(kFastPathCapture));
  EXPECT_FALSE(r.runner.capturing());
  EXPECT_EQ(r.sgd.steps(), 4);
  expect_same_weights_and_momentum(r, eager);
}

// A replay that throws (a launch error, out of memory) is caught by the check: the step runs
// eagerly again, the rest as they come, with one warning; the verdict is not kept (the path
// could not run here, which says nothing of what it computes: a restart tries again).
TEST(CaptureCheck, AReplayThatFailsRunsEagerlyAndIsNotKeptAsAVerdict) {
  RecorderRun r, eager;
  r.be.fail_replay = true;
  const std::string out = four_steps_beside_eager(r, eager, 310);
  EXPECT_NE(out.find("first replay failed (this recorder's replay fails)"), std::string::npos) << out;
  EXPECT_EQ(r.be.calls, (Calls{"begin 8", "end", "replay 8", "drop"}));
  EXPECT_FALSE(r.runner.capturing());
  EXPECT_FALSE(r.runner.fast_path_checks().off(kFastPathCapture)) << "kept as a verdict";
  EXPECT_NE(r.runner.capture_failure().find("first replay failed"), std::string::npos);
  EXPECT_EQ(r.sgd.steps(), 4);
  EXPECT_EQ(host_copy(r.be, r.model.flat_params()), host_copy(eager.be, eager.model.flat_params()));
}

// fp16: a checked step that overflowed both ways (its loss NaN both ways, as a forward past
// fp16's range gives) compares no update. It neither fails nor passes: the step runs eagerly,
// the next is recorded and checked, and that one passes; capture stays on.
TEST(CaptureCheck, AnFp16StepThatOverflowedBothWaysIsCheckedAgainAtTheNextStep) {
  RecorderRun r(Precision::fp16), eager(Precision::fp16);
  // Two eager steps, then the checked step (its eager reference, its recording and its eager
  // run again) overflow; the eager run's three steps alike.
  r.be.forced_overflows = StepRunner::kEagerBeforeCapture + 3;
  eager.be.forced_overflows = StepRunner::kEagerBeforeCapture + 1;
  const std::string out = four_steps_beside_eager(r, eager, 320);
  EXPECT_NE(out.find("overflowed both ways"), std::string::npos) << out;
  EXPECT_EQ(out.find("turned off"), std::string::npos) << out;
  EXPECT_EQ(r.be.calls, (Calls{"begin 8", "end", "replay 8", "drop", "begin 8", "end", "replay 8"}));
  EXPECT_TRUE(r.runner.fast_path_checks().checked(kFastPathCapture));
  EXPECT_FALSE(r.runner.fast_path_checks().off(kFastPathCapture));
  EXPECT_TRUE(r.runner.captured());
  EXPECT_EQ(r.sgd.steps(), 1) << "one step of four applied";
  EXPECT_EQ(r.sgd.steps(), eager.sgd.steps());
  EXPECT_EQ(r.scaler.scale(), eager.scaler.scale());
  EXPECT_EQ(host_copy(r.be, r.model.flat_params()), host_copy(eager.be, eager.model.flat_params()));
}

namespace {

// Moves every weight of `t` (host fp32 through the backend) one float away from zero.
void nudge_one_ulp(Backend& be, Tensor& t) {
  Tensor h = be.to_host(t);
  float* p = h.data<float>();
  for (int64_t i = 0; i < h.numel(); ++i) p[i] = std::nextafter(p[i], p[i] < 0 ? -INFINITY : INFINITY);
  be.copy(be.from_host(h), t);
}

// ||w_after - w_before|| over the norm of each weight's ulp: how many ulps the update is.
double update_in_ulps(const std::vector<float>& before, const std::vector<float>& after) {
  double du = 0, ulp = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    const double u = double(std::nextafter(std::fabs(before[i]), INFINITY)) - std::fabs(before[i]);
    du += (double(after[i]) - before[i]) * (double(after[i]) - before[i]);
    ulp += u * u;
  }
  return std::sqrt(du / ulp);
}

}  // namespace

// A warm-up rate makes the checked step's update a few ulps of each weight; a captured step
// whose gradients differ from the eager step's by rounding then lands each weight on a float
// beside the eager one's. Simulated by a replay that moves every weight one ulp: the check
// passes (it compares the momentum buffers, and the weights within an ulp). The same replay
// that doubles the update instead (a wrong rate, the momentum buffers right) still fails it.
TEST(CaptureCheck, AWarmUpStepOneUlpOffPassesAndAWrongRateStillFails) {
  const float warm_lr = 2e-6f;
  {
    RecorderRun eager;
    eager.lr = warm_lr;
    for (int i = 0; i < StepRunner::kEagerBeforeCapture; ++i) eager.step(8, 330 + uint64_t(i));
    const std::vector<float> before = host_copy(eager.be, eager.model.flat_params());
    eager.step(8, 330 + StepRunner::kEagerBeforeCapture);
    const double ulps = update_in_ulps(before, host_copy(eager.be, eager.model.flat_params()));
    EXPECT_GT(ulps, 0.5) << "the update is no longer a few ulps: the test lost its point";
    EXPECT_LT(ulps, 8.0) << "the update is no longer a few ulps: the test lost its point";
  }
  RecorderRun r;
  r.lr = warm_lr;
  r.be.at_replay = [&] { nudge_one_ulp(r.be, r.model.flat_params()); };
  EXPECT_EQ(r.runner.use_captured_steps(), "");
  for (int i = 0; i <= StepRunner::kEagerBeforeCapture; ++i) r.step(8, 330 + uint64_t(i));
  EXPECT_TRUE(r.runner.fast_path_checks().checked(kFastPathCapture));
  EXPECT_FALSE(r.runner.fast_path_checks().off(kFastPathCapture))
      << r.runner.fast_path_checks().why_off(kFastPathCapture);
  EXPECT_TRUE(r.runner.captured());

  RecorderRun w;
  w.lr = warm_lr;
  std::vector<float> before;
  w.be.at_replay = [&] {  // w_after = w_before + 2 x the update
    Tensor h = w.be.to_host(w.model.flat_params());
    float* p = h.data<float>();
    for (int64_t i = 0; i < h.numel(); ++i) p[i] += p[i] - before[size_t(i)];
    w.be.copy(w.be.from_host(h), w.model.flat_params());
  };
  EXPECT_EQ(w.runner.use_captured_steps(), "");
  for (int i = 0; i < StepRunner::kEagerBeforeCapture; ++i) w.step(8, 330 + uint64_t(i));
  before = host_copy(w.be, w.model.flat_params());
  testing::internal::CaptureStdout();
  w.step(8, 330 + StepRunner::kEagerBeforeCapture);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(w.runner.fast_path_checks().off(kFastPathCapture));
  EXPECT_NE(out.find("the weights' update (beyond an ulp"), std::string::npos) << out;
}

// update_difference allows one ulp of each weight and counts the rest in full, relative to
// the reference's update; a NaN the reference has not is infinite.
TEST(CaptureCheck, TheUpdateDifferenceAllowsAnUlpOfEachWeight) {
  const std::vector<float> before = {1.f, -2.f, 0.5f, 3.f};
  std::vector<float> want(4), one(4), three(4);
  for (size_t i = 0; i < 4; ++i) {
    const float up = before[i] > 0 ? INFINITY : -INFINITY;
    want[i] = std::nextafter(std::nextafter(before[i], up), up);  // an update of two ulps
    one[i] = std::nextafter(want[i], up);
    three[i] = std::nextafter(std::nextafter(one[i], up), up);
  }
  EXPECT_EQ(update_difference(before, want, want), 0.0);
  EXPECT_EQ(update_difference(before, want, one), 0.0);
  // Three ulps off: two count, against an update of two ulps.
  EXPECT_NEAR(update_difference(before, want, three), 1.0, 1e-6);
  std::vector<float> nan = want;
  nan[2] = std::nan("");
  EXPECT_TRUE(std::isinf(update_difference(before, want, nan)));
  EXPECT_TRUE(std::isinf(update_difference(before, want, {1.f})));
}

// fast-paths.json is keyed by the device itself (host, GPU UUID and slot), not its model: one
// device's verdict holds on it alone. Every rank writes only its own device's verdicts, merged
// into the file as it is when written: ranks (of several devices, or sharing one) that opened
// the file before any wrote keep each other's verdicts.
TEST(FastPathChecks, EachDeviceKeepsItsOwnVerdictsAndRanksKeepEachOthers) {
  const std::string info = "GPU NVIDIA H100 80GB HBM3 (sm 9.0, 79.2 GiB, 8 devices), driver 580";
  const std::string a = fast_path_device("node-1", "GPU-aaaa", "0000:19:00.0", info),
                    b = fast_path_device("node-1", "GPU-bbbb", "0000:3b:00.0", info),
                    c = fast_path_device("node-2", "GPU-cccc", "0000:19:00.0", info);
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a.find("GPU-aaaa"), std::string::npos) << a;
  EXPECT_NE(a.find("node-1"), std::string::npos) << a;
  EXPECT_NE(fast_path_device("node-1", "", "", "cpu (oneDNN)"),
            fast_path_device("node-2", "", "", "cpu (oneDNN)"));

  const std::string dir = ::testing::TempDir() + "/spotrain_fast_paths_ranks";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/fast-paths.json";
  {
    FastPathChecks ra(file, a), rb(file, b), ra2(file, a);  // ra2: a rank sharing a's GPU
    testing::internal::CaptureStdout();
    ra.failed(kFastPathCapture, "the loss (eager 2.3, captured nan)");
    rb.failed(kFastPathFusion, "the output of layer1.0.conv2");
    ra2.failed(kFastPathPixels, "the 8-bit upload");
    testing::internal::GetCapturedStdout();
  }
  FastPathChecks again_a(file, a), again_b(file, b), again_c(file, c);
  EXPECT_TRUE(again_a.off(kFastPathCapture));
  EXPECT_TRUE(again_a.off(kFastPathPixels));
  EXPECT_FALSE(again_a.off(kFastPathFusion));
  EXPECT_TRUE(again_b.off(kFastPathFusion));
  EXPECT_FALSE(again_b.off(kFastPathCapture)) << "another GPU of the same model turned off";
  EXPECT_FALSE(again_c.off(kFastPathCapture));
  EXPECT_FALSE(again_c.off(kFastPathFusion));
  std::filesystem::remove_all(dir);
}
