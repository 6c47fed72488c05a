// Whole training steps on the GPU (the ops one by one are tests/test_backend_ops.cpp's):
// twenty steps of ResNet-20 on 28x28x1 images against the CPU, step by step and left free
// (bitwise repeatable under --deterministic); fp16 overflow skipping; --fusion bn against the
// plain step; steps read a step late against steps read at once; captured steps (CUDA
// Graphs) against eager ones; the caching allocator's steady state and its pools per backend;
// uploads from pinned staging memory. Each GPU test skips without a CUDA device.
#include <gtest/gtest.h>
#ifdef SPOTRAIN_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/cublas_lazy.h"
#endif

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/loss_scaler.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "core/philox.h"
#include "engine/fast_paths.h"
#include "engine/step.h"
#include "kernels/elementwise.h"
#include "kernels/ops.h"
#include "kernels/step_capture.h"
#include "fmnist_resnet.h"
#include "layers/resnet.h"
#include "step_reference.h"

using namespace spotrain;

namespace {
const float kInf = std::numeric_limits<float>::infinity();

bool have_gpu() {
  static const bool yes = cuda_backend_ready();
  return yes;
}

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

struct Prec {
  const char* name;
  DType dt;
  bool tf32;
};
const Prec kPrecs[] = {
    {"fp32", DType::f32, false},
    {"tf32", DType::f32, true},
    {"bf16", DType::bf16, false},
    {"fp16", DType::f16, false},
};
std::string prec_name(const ::testing::TestParamInfo<Prec>& i) { return i.param.name; }
// How gtest (and so the CTest test list) prints a parameter: its name, not its bytes.
void PrintTo(const Prec& p, std::ostream* os) { *os << p.name; }
Precision precision_of(const Prec& p) {
  return p.dt == DType::f16    ? Precision::fp16
         : p.dt == DType::bf16 ? Precision::bf16
         : p.tf32              ? Precision::tf32
                               : Precision::fp32;
}

std::unique_ptr<Backend> cpu() {
  BackendOptions o;
  o.threads = 2;
  return make_backend("cpu", o);
}

std::unique_ptr<Backend> gpu(bool tf32 = false, bool deterministic = false) {
  BackendOptions o;
  o.tf32 = tf32;
  o.deterministic = deterministic;
  o.poison = true;
  return make_backend("cuda", o);
}

std::vector<float> normals(int64_t n, uint64_t seed, float scale = 1.f, float shift = 0.f) {
  Philox rng(seed, 77);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = rng.normal() * scale + shift;
  return v;
}

// Host fp32 tensors: 4-D ones NHWC (the logical order (N, C, H, W) filled from `v` in memory
// order, which is all a random input needs), others plain.
Tensor host_nhwc(const Shape& s, uint64_t seed, float scale = 1.f) {
  Tensor t = Tensor::host(s, DType::f32, Layout::nhwc);
  auto v = normals(t.numel(), seed, scale);
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}
Tensor host_plain(const Shape& s, uint64_t seed, float scale = 1.f, float shift = 0.f) {
  Tensor t = Tensor::host(s);
  auto v = normals(t.numel(), seed, scale, shift);
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

// Any tensor's values in canonical order (4-D: NCHW).
std::vector<float> values(Backend& be, const Tensor& t) {
  Tensor h = be.to_host(t);
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

// ||got - want|| / ||want||; infinite when got has a NaN or inf where want has none (an
// unwritten, poisoned element) or the sizes differ.
double nerr(const std::vector<float>& got, const std::vector<float>& want) {
  return normalized_difference(got, want);
}

// ---- whole steps -----------------------------------------------------------------------------

struct TrainRun {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Model> model;
  std::unique_ptr<Sgd> sgd;
};

TrainRun make_run(std::unique_ptr<Backend> be, const char* fusion = "none") {
  TrainRun r;
  r.be = std::move(be);
  ResNetOptions o = fmnist_resnet20();
  o.fusion_links = o.fusion_on = std::string(fusion) == "bn";
  r.model = std::make_unique<Model>(build_resnet(o), *r.be);
  r.model->initialize(2024);
  r.sgd = std::make_unique<Sgd>(*r.model, SgdOptions{});
  return r;
}

// Fashion-MNIST-shaped batches (step_reference.h).
using Batch = StepBatch;
Batch batch(int64_t n, uint64_t seed) { return fmnist_like_batch(n, seed); }

// Sets `dst` (on its backend) to the values of `src` (on another).
void assign(Backend& dst_be, Tensor& dst, Backend& src_be, const Tensor& src) {
  Tensor staged = dst_be.from_host(src_be.to_host(src));
  dst_be.copy(staged, dst);
}

// The GPU's fp32 training step against the CPU's, from the same state at each of twenty
// points along the CPU's trajectory: the same loss, the same parameter update, the same
// running statistics. (Left to run free, two trajectories that differ only in rounding drift
// apart by several percent within twenty steps of this small-batch training, as two CPU runs
// with different thread counts do; so each step starts from the CPU's state instead.)
TEST(GpuTraining, TwentyStepsFollowTheCpuStepByStep) {
  REQUIRE_GPU();
  TrainRun c = make_run(cpu());
  TrainRun g = make_run(gpu(false, /*deterministic=*/true));
  // Same initial weights (the same Philox draws on both).
  EXPECT_EQ(nerr(values(*g.be, g.model->flat_params()), values(*c.be, c.model->flat_params())),
            0.0);
  LossScaler sc{LossScalerOptions{}}, sg{LossScalerOptions{}};
  StepRunner rc(*c.model, *c.sgd, sc, Precision::fp32), rg(*g.model, *g.sgd, sg, Precision::fp32);
  for (int step = 0; step < 20; ++step) {
    // The GPU takes the CPU's state: parameters, momentum, BN running statistics.
    assign(*g.be, g.model->flat_params(), *c.be, c.model->flat_params());
    assign(*g.be, g.sgd->momentum(), *c.be, c.sgd->momentum());
    for (size_t i = 0; i < g.model->buffers().size(); ++i)
      assign(*g.be, g.model->buffers()[i]->value, *c.be, c.model->buffers()[i]->value);
    std::vector<float> before = values(*c.be, c.model->flat_params());
    Batch b = batch(16, 1000 + uint64_t(step));
    double lc = rc.run(b.images, b.labels.data(), 0.05f, 0.1f).loss.loss;
    double lg = rg.run(b.images, b.labels.data(), 0.05f, 0.1f).loss.loss;
    EXPECT_NEAR(lg, lc, 1e-4 * std::fabs(lc)) << "step " << step;
    std::vector<float> pc = values(*c.be, c.model->flat_params());
    std::vector<float> pg = values(*g.be, g.model->flat_params());
    for (size_t i = 0; i < before.size(); ++i) {
      pc[i] -= before[i];
      pg[i] -= before[i];
    }
    // Measured on an H200: 0.3e-3 to 5.4e-3 (batch-norm backward over 16 small images
    // cancels heavily, and cuDNN's persistent NHWC kernels, the mode PyTorch also uses for
    // channels-last training, sum in another order than oneDNN). A wrong formula anywhere in
    // the step gives errors of order one.
    EXPECT_LE(nerr(pg, pc), 2e-2) << "parameter update, step " << step;
    for (size_t i = 0; i < g.model->buffers().size(); ++i)
      EXPECT_LE(nerr(values(*g.be, g.model->buffers()[i]->value),
                     values(*c.be, c.model->buffers()[i]->value)),
                1e-4)
          << g.model->buffers()[i]->name << ", step " << step;
  }
}

// Left to run free for twenty steps: a second GPU run with --deterministic repeats the first
// bit for bit, and the loss ends where the CPU's does (a loose bound that catches blow-ups;
// the step-by-step test above checks the arithmetic, for the reason given there).
TEST(GpuTraining, TwentyFreeStepsLearnAndRepeatBitwise) {
  REQUIRE_GPU();
  auto losses = [](TrainRun& r) {
    LossScaler s{LossScalerOptions{}};
    StepRunner runner(*r.model, *r.sgd, s, Precision::fp32);
    std::vector<double> l;
    for (int step = 0; step < 20; ++step) {
      Batch b = batch(16, 1000 + uint64_t(step));
      l.push_back(runner.run(b.images, b.labels.data(), 0.05f, 0.1f).loss.loss);
    }
    return l;
  };
  TrainRun c = make_run(cpu());
  TrainRun g = make_run(gpu(false, /*deterministic=*/true));
  std::vector<double> lc = losses(c), lg = losses(g);
  auto tail = [](const std::vector<double>& l) {
    double s = 0;
    for (size_t i = l.size() - 5; i < l.size(); ++i) s += l[i];
    return s / 5;
  };
  EXPECT_NEAR(tail(lg), tail(lc), 0.1 * tail(lc));
  TrainRun g2 = make_run(gpu(false, true));
  std::vector<double> l2 = losses(g2);
  for (int step = 0; step < 20; ++step)
    EXPECT_EQ(std::memcmp(&l2[size_t(step)], &lg[size_t(step)], sizeof(double)), 0)
        << "step " << step;
  EXPECT_EQ(std::memcmp(values(*g2.be, g2.model->flat_params()).data(),
                        values(*g.be, g.model->flat_params()).data(),
                        size_t(g.model->flat_params().numel()) * 4),
            0);
}

TEST(GpuTraining, Fp16OverflowSkipsTheStepAndHalvesTheScale) {
  REQUIRE_GPU();
  TrainRun g = make_run(gpu());
  Batch b = batch(8, 1100);
  auto p0 = values(*g.be, g.model->flat_params()), m0 = values(*g.be, g.sgd->momentum());
  LossScalerOptions o;
  o.enabled = true;
  o.init_scale = std::ldexp(1.0, 40);
  LossScaler huge(o);
  StepResult r =
      StepRunner(*g.model, *g.sgd, huge, Precision::fp16).run(b.images, b.labels.data(), 0.1f, 0.f);
  EXPECT_TRUE(r.overflow);
  EXPECT_TRUE(std::isfinite(r.loss.loss));
  EXPECT_EQ(huge.scale(), std::ldexp(1.0, 39));
  EXPECT_EQ(g.sgd->steps(), 0);
  auto p1 = values(*g.be, g.model->flat_params()), m1 = values(*g.be, g.sgd->momentum());
  ASSERT_EQ(p1.size(), p0.size());
  EXPECT_EQ(std::memcmp(p0.data(), p1.data(), p0.size() * 4), 0) << "params changed on overflow";
  EXPECT_EQ(std::memcmp(m0.data(), m1.data(), m0.size() * 4), 0) << "momentum changed on overflow";
  // A scale that fits: the step is applied.
  o.init_scale = 1024;
  LossScaler fits(o);
  r = StepRunner(*g.model, *g.sgd, fits, Precision::fp16).run(b.images, b.labels.data(), 0.1f, 0.f);
  EXPECT_FALSE(r.overflow);
  EXPECT_EQ(g.sgd->steps(), 1);
  auto p2 = values(*g.be, g.model->flat_params());
  EXPECT_NE(std::memcmp(p1.data(), p2.data(), p1.size() * 4), 0) << "params did not change";
}

// --fusion bn at fp16 on the GPU (cuDNN's graphs where it takes resnet20's shapes): from the
// same weights, the unfused run's losses, step for step, up to fp16 rounding.
TEST(GpuTraining, FusedFp16StepsFollowTheUnfusedSteps) {
  REQUIRE_GPU();
  TrainRun plain = make_run(gpu()), fused = make_run(gpu(), "bn");
  LossScaler sp{LossScalerOptions{}}, sf{LossScalerOptions{}};
  StepRunner rp(*plain.model, *plain.sgd, sp, Precision::fp16),
      rf(*fused.model, *fused.sgd, sf, Precision::fp16);
  for (int step = 0; step < 5; ++step) {
    Batch b = batch(32, 1500 + uint64_t(step));
    StepResult a = rp.run(b.images, b.labels.data(), 0.05f, 0.1f);
    StepResult f = rf.run(b.images, b.labels.data(), 0.05f, 0.1f);
    EXPECT_EQ(f.overflow, a.overflow) << "step " << step;
    EXPECT_NEAR(f.loss.loss, a.loss.loss, (step == 0 ? 2e-3 : 2e-2) * a.loss.loss) << "step " << step;
  }
  EXPECT_LE(nerr(values(*fused.be, fused.model->flat_params()),
                 values(*plain.be, plain.model->flat_params())), 1e-2);
  for (const std::string& l : fused.be->kernel_choices())
    if (l.find("graph: accepted") != std::string::npos) std::printf("  %s\n", l.c_str());
}

// On the GPU, steps queued back to back (the loss and overflow verdict read a step later, the
// update skipped by the device's own flag) against the step read at once: the same verdicts
// and scales, and with --deterministic bitwise the same weights. The two runs' backends work
// side by side in one process, each on its own stream and memory pool.
TEST(GpuTraining, QueuedFp16StepsEqualStepsReadAtOnce) {
  REQUIRE_GPU();
  TrainRun a = make_run(gpu(false, /*deterministic=*/true));
  TrainRun q = make_run(gpu(false, /*deterministic=*/true));
  LossScaler sa = bouncing_scaler(), sq = bouncing_scaler();
  StepRunner runner(*q.model, *q.sgd, sq, Precision::fp16);
  std::vector<StepResult> ra, rq;
  const int kSteps = 30;
  for (int i = 0; i < kSteps; ++i) {
    Batch b = batch(16, 1300 + uint64_t(i));
    ra.push_back(reference_step(*a.model, *a.sgd, sa, DType::f16, b.images, b.labels.data(),
                                0.05f, 0.1f));
    runner.queue(b.images, b.labels.data(), 0.05f, 0.1f);
    for (const StepResult& r : runner.take_results()) rq.push_back(r);
  }
  runner.settle();
  for (const StepResult& r : runner.take_results()) rq.push_back(r);
  ASSERT_EQ(rq.size(), ra.size());
  const int overflows = expect_same_results(rq, ra);
  EXPECT_GT(overflows, 2);
  EXPECT_LT(overflows, kSteps - 5);
  auto pa = values(*a.be, a.model->flat_params()), pq = values(*q.be, q.model->flat_params());
  EXPECT_EQ(std::memcmp(pa.data(), pq.data(), pa.size() * 4), 0);
  EXPECT_EQ(q.sgd->steps(), a.sgd->steps());
  EXPECT_EQ(sq.scale(), sa.scale());
}

// ---- captured steps (--cuda-graph) -----------------------------------------------------------

// Bitwise the same weights and momentum, update count and loss scale in runs e and c.
void expect_same_training_state(const TrainRun& e, const TrainRun& c, const LossScaler& se,
                                const LossScaler& sc) {
  auto pe = values(*e.be, e.model->flat_params()), pc = values(*c.be, c.model->flat_params());
  EXPECT_EQ(std::memcmp(pe.data(), pc.data(), pe.size() * 4), 0) << "weights differ";
  auto me = values(*e.be, e.sgd->momentum()), mc = values(*c.be, c.sgd->momentum());
  EXPECT_EQ(std::memcmp(me.data(), mc.data(), me.size() * 4), 0) << "momentum differs";
  EXPECT_EQ(c.sgd->steps(), e.sgd->steps());
  EXPECT_EQ(sc.scale(), se.scale());
}

// Settles the eager runner `re` and the capturing one `rc`, adds their last figures to `ge` and
// `gc`, and checks that `rc` ran its `steps` steps captured, with no failure, giving the eager
// run's figures.
void settle_and_expect_captured_as_eager(StepRunner& re, StepRunner& rc, std::vector<StepResult>& ge,
                                         std::vector<StepResult>& gc, size_t steps) {
  re.settle();
  rc.settle();
  for (const StepResult& r : re.take_results()) ge.push_back(r);
  for (const StepResult& r : rc.take_results()) gc.push_back(r);
  ASSERT_EQ(gc.size(), steps);
  EXPECT_TRUE(rc.captured());
  EXPECT_EQ(rc.capture_failure(), "");
  expect_same_results(gc, ge);
}

// Two deterministic GPU runs of the same steps, one eager and one replaying a captured step:
// the same losses, verdicts and scales, bitwise the same weights and momentum, and an eager
// evaluation forward afterwards sees the replayed weights (their compute copies refreshed).
void expect_captured_equals_eager(const Prec& pr, bool mixed) {
  TrainRun e = make_run(gpu(pr.tf32, /*deterministic=*/true));
  TrainRun c = make_run(gpu(pr.tf32, /*deterministic=*/true));
  const bool fp16 = pr.dt == DType::f16;
  LossScaler se = fp16 ? bouncing_scaler() : LossScaler(LossScalerOptions{});
  LossScaler sc = fp16 ? bouncing_scaler() : LossScaler(LossScalerOptions{});
  StepRunner re(*e.model, *e.sgd, se, precision_of(pr));
  StepRunner rc(*c.model, *c.sgd, sc, precision_of(pr));
  rc.use_captured_steps();
  const int kSteps = 14;
  std::vector<StepResult> ge = queued_steps(re, kSteps, 1400, mixed);
  std::vector<StepResult> gc = queued_steps(rc, kSteps, 1400, mixed);
  ASSERT_EQ(ge.size(), size_t(kSteps));
  ASSERT_EQ(gc.size(), size_t(kSteps));
  const int overflows = expect_same_results(gc, ge);
  // Losses that change from step to step: the replays read each step's own labels and weights.
  EXPECT_NE(gc.back().loss.loss, gc[StepRunner::kEagerBeforeCapture + 1].loss.loss);
  if (fp16) {  // replays both skipped and applied updates
    EXPECT_GT(overflows, 1);
    EXPECT_LT(overflows, kSteps - 4);
  }
  expect_same_training_state(e, c, se, sc);
  Batch t = batch(16, 99);
  auto le = values(*e.be, e.model->forward(e.be->upload_images(t.images, pr.dt), false));
  auto lc = values(*c.be, c.model->forward(c.be->upload_images(t.images, pr.dt), false));
  EXPECT_EQ(std::memcmp(le.data(), lc.data(), le.size() * 4), 0) << "evaluation saw stale weights";
  EXPECT_GT(c.be->capture()->reserved_bytes(), 0u);
}

class GpuCapture : public ::testing::TestWithParam<Prec> {};

TEST_P(GpuCapture, ReplayedStepsEqualEagerSteps) {
  REQUIRE_GPU();
  expect_captured_equals_eager(GetParam(), /*mixed=*/false);
}

INSTANTIATE_TEST_SUITE_P(Precisions, GpuCapture, ::testing::ValuesIn(kPrecs), prec_name);

TEST(GpuCaptureMixed, ReplayedStepsWithMixedTargetsEqualEagerSteps) {
  REQUIRE_GPU();
  expect_captured_equals_eager(kPrecs[3], /*mixed=*/true);  // fp16
}

// LARS inside a captured step: each tensor's trust ratio is computed on the device from the
// replayed weights and gradients, and the learning rate, different at every step, comes from
// the memory each replay refills. Bitwise the eager run's steps (at fp16 with its skipped
// updates too), weights and momentum.
void expect_captured_lars_equals_eager(const Prec& pr) {
  TrainRun e = make_run(gpu(pr.tf32, /*deterministic=*/true));
  TrainRun c = make_run(gpu(pr.tf32, /*deterministic=*/true));
  SgdOptions lars;
  lars.kind = "lars";
  e.sgd = std::make_unique<Sgd>(*e.model, lars);
  c.sgd = std::make_unique<Sgd>(*c.model, lars);
  const bool fp16 = pr.dt == DType::f16;
  LossScaler se = fp16 ? bouncing_scaler() : LossScaler(LossScalerOptions{});
  LossScaler sc = fp16 ? bouncing_scaler() : LossScaler(LossScalerOptions{});
  StepRunner re(*e.model, *e.sgd, se, precision_of(pr)), rc(*c.model, *c.sgd, sc, precision_of(pr));
  EXPECT_EQ(rc.use_captured_steps(), "");
  std::vector<StepResult> ge, gc;
  const int kSteps = 14;
  for (int i = 0; i < kSteps; ++i) {
    Batch b = batch(16, 1600 + uint64_t(i));
    const float lr = 0.5f + 0.25f * float(i % 5);
    re.queue(b.images, b.labels.data(), lr, 0.1f);
    rc.queue(b.images, b.labels.data(), lr, 0.1f);
    for (const StepResult& r : re.take_results()) ge.push_back(r);
    for (const StepResult& r : rc.take_results()) gc.push_back(r);
  }
  ASSERT_NO_FATAL_FAILURE(settle_and_expect_captured_as_eager(re, rc, ge, gc, size_t(kSteps)));
  expect_same_training_state(e, c, se, sc);
  EXPECT_NE(gc.back().loss.loss, gc[StepRunner::kEagerBeforeCapture + 1].loss.loss);
}

TEST(GpuCaptureLars, ReplayedLarsStepsEqualEagerStepsFp32) {
  REQUIRE_GPU();
  expect_captured_lars_equals_eager(kPrecs[0]);
}

TEST(GpuCaptureLars, ReplayedLarsStepsEqualEagerStepsFp16) {
  REQUIRE_GPU();
  expect_captured_lars_equals_eager(kPrecs[3]);
}

// A batch unlike the captured one runs as it comes between replays, queued back to back (each
// step read back during the next, the eager one's forward queued ahead of the replay's read-back;
// at fp16 the update skipped or applied by the device): the same figures and bitwise the same
// weights as an eager run of the same batches, and the replays go on after it (a replayed step
// is timed as one `captured` phase, an eager one in phases).
void expect_another_size_runs_as_it_comes(const Prec& pr) {
  TrainRun e = make_run(gpu(pr.tf32, /*deterministic=*/true));
  TrainRun c = make_run(gpu(pr.tf32, /*deterministic=*/true));
  const bool fp16 = pr.dt == DType::f16;
  LossScaler se = fp16 ? bouncing_scaler() : LossScaler(LossScalerOptions{});
  LossScaler sc = fp16 ? bouncing_scaler() : LossScaler(LossScalerOptions{});
  StepRunner re(*e.model, *e.sgd, se, precision_of(pr)), rc(*c.model, *c.sgd, sc, precision_of(pr));
  EXPECT_EQ(rc.use_captured_steps(), "");
  const int64_t sizes[] = {16, 16, 16, 16, 8, 16, 16, 8, 16};
  const bool replayed[] = {false, false, true, true, false, true, true, false, true};
  std::vector<StepResult> ge, gc;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    Batch b = batch(sizes[i], 1500 + uint64_t(i));
    StepTimes t;
    re.queue(b.images, b.labels.data(), 0.05f, 0.1f);
    rc.queue(b.images, b.labels.data(), 0.05f, 0.1f, &t);
    EXPECT_EQ(t.captured > 0, replayed[i]) << "step " << i + 1;
    EXPECT_EQ(t.forward > 0, !replayed[i]) << "step " << i + 1;
    for (const StepResult& r : re.take_results()) ge.push_back(r);
    for (const StepResult& r : rc.take_results()) gc.push_back(r);
  }
  ASSERT_NO_FATAL_FAILURE(settle_and_expect_captured_as_eager(re, rc, ge, gc, std::size(sizes)));
  expect_same_training_state(e, c, se, sc);
}

TEST(GpuCaptureMixed, ABatchOfAnotherSizeRunsAsItComesBf16) {
  REQUIRE_GPU();
  expect_another_size_runs_as_it_comes(kPrecs[2]);
}

TEST(GpuCaptureMixed, ABatchOfAnotherSizeRunsAsItComesFp16) {
  REQUIRE_GPU();
  expect_another_size_runs_as_it_comes(kPrecs[3]);
}

class GpuAllocator : public ::testing::TestWithParam<Prec> {};

TEST_P(GpuAllocator, SteadyStateStepsAllocateNothingNew) {
  REQUIRE_GPU();
  Prec pr = GetParam();
  TrainRun g = make_run(gpu(pr.tf32));
  LossScalerOptions o;
  o.enabled = pr.dt == DType::f16;
  o.init_scale = 1024;
  LossScaler s(o);
  StepRunner runner(*g.model, *g.sgd, s, precision_of(pr));
  Batch b = batch(32, 1200);
  for (int i = 0; i < 3; ++i) runner.run(b.images, b.labels.data(), 0.05f, 0.f);
  g.be->synchronize();
  AllocatorStats before = g.be->allocator().stats();
  for (int i = 0; i < 5; ++i) runner.run(b.images, b.labels.data(), 0.05f, 0.f);
  g.be->synchronize();
  AllocatorStats after = g.be->allocator().stats();
  EXPECT_EQ(after.system_allocs, before.system_allocs) << "cudaMalloc in a steady-state step";
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(after.current_bytes, before.current_bytes) << "device memory leaks per step";
  EXPECT_GT(after.peak_bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(Precisions, GpuAllocator, ::testing::ValuesIn(kPrecs), prec_name);

// Each backend allocates from a pool of its own: a block one backend frees while its stream may
// still use it never goes to another backend's stream. Shared, two backends in one process
// wrote into each other's live blocks: QueuedFp16StepsEqualStepsReadAtOnce's reference run
// read NaN logits on an H200 while the queued run's backward still used its blocks.
TEST(GpuAllocator, EachBackendHasAPoolOfItsOwn) {
  REQUIRE_GPU();
  auto a = gpu(), b = gpu();
  EXPECT_NE(&a->allocator(), &b->allocator());
  void* freed = nullptr;
  {
    Tensor t = a->zeros({1 << 20});
    freed = t.raw();
  }
  Tensor u = b->zeros({1 << 20});
  EXPECT_NE(u.raw(), freed) << "a block one backend freed went to another";
  Tensor v = a->zeros({1 << 20});
  EXPECT_EQ(v.raw(), freed) << "the backend's own cache serves it again";
}

// ---- without a GPU ---------------------------------------------------------------------------

// cuBLAS is not loaded at start-up (it costs ~210 MB RSS) but on first use, and loading it
// needs no GPU: the library CMake found resolves, with the version the build was made with.
TEST(GpuBackend, CublasLoadsOnFirstUse) {
#ifdef SPOTRAIN_WITH_CUDA
  int devices = 0;
  bool gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  cudaGetLastError();
  if (!gpu) {  // (with a GPU, backends made by earlier tests in this process load it)
    EXPECT_FALSE(spotrain::cuda::blas::loaded()) << "cuBLAS was loaded before any use";
  }
  std::string v = spotrain::cuda::blas::version();
  EXPECT_TRUE(spotrain::cuda::blas::loaded());
  EXPECT_EQ(v.rfind(std::to_string(CUBLAS_VER_MAJOR) + ".", 0), 0u) << v;
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuBackend, WithoutADeviceCudaFailsCleanlyAndAutoPicksTheCpu) {
  if (have_gpu()) GTEST_SKIP() << "a CUDA device is present";
  try {
    make_backend("cuda", BackendOptions{});
    FAIL() << "make_backend(\"cuda\") succeeded without a device";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_TRUE(m.find("no CUDA device") != std::string::npos ||
                m.find("no CUDA support") != std::string::npos)
        << m;
  }
  EXPECT_EQ(make_backend("auto", BackendOptions{})->device(), Device::cpu);
}

// ---- image upload from the loader's host staging memory ---------------------------------

TEST(HostStaging, CpuBackendUsesTheHostAllocator) {
  EXPECT_EQ(&cpu()->host_staging_allocator(), &Allocator::host());
}

// The loader writes batches into the backend's host staging memory (pinned on CUDA); the
// upload from it (one async DMA, no staging copy) must equal the pageable path's.
TEST(HostStaging, PinnedAndPageableUploadsAgree) {
  REQUIRE_GPU();
  auto g = gpu();
  Allocator& pinned = g->host_staging_allocator();
  ASSERT_NE(&pinned, &Allocator::host());
  EXPECT_EQ(pinned.device(), Device::cpu);
  const Shape s{3, 5, 9, 7};
  for (DType dt : {DType::f32, DType::bf16}) {
    std::vector<Tensor> from_pinned, from_pageable;
    std::vector<std::vector<float>> want;
    // Several uploads in flight at once, the pinned sources dropped right after each upload.
    for (int i = 0; i < 5; ++i) {
      Tensor pageable = host_nhwc(s, 1400 + uint64_t(i));
      Tensor src(s, DType::f32, pinned, Layout::nhwc);
      std::memcpy(src.raw(), pageable.raw(), pageable.nbytes());
      const void* addr = src.raw();
      from_pinned.push_back(g->upload_images(src, dt));
      src = Tensor();
      // The backend still holds the source until its copy is done: new staging memory must
      // not reuse it, and writing into the new one must not change the upload.
      Tensor next(s, DType::f32, pinned, Layout::nhwc);
      EXPECT_NE(next.raw(), addr);
      std::memset(next.raw(), 0x7f, next.nbytes());
      from_pageable.push_back(g->upload_images(pageable, dt));
    }
    g->synchronize();
    for (size_t i = 0; i < from_pinned.size(); ++i) {
      auto a = values(*g, from_pinned[i]), b = values(*g, from_pageable[i]);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "upload " << i;
    }
  }
#ifdef SPOTRAIN_WITH_CUDA
  Tensor src(s, DType::f32, pinned, Layout::nhwc);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, src.raw()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  Tensor pageable = Tensor::host(s, DType::f32, Layout::nhwc);
  ASSERT_EQ(cudaPointerGetAttributes(&attr, pageable.raw()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeUnregistered);
#endif
}

// bn_infer (kernels/elementwise.h) is what the GPU's inference kernel runs: check it on the
// CPU against oneDNN's inference batch norm.
TEST(SharedMath, BnInferMatchesTheCpuBackend) {
  auto c = cpu();
  Shape s{2, 5, 3, 4};
  Tensor hx = host_nhwc(s, 1301);
  Tensor hg = host_plain({5}, 1302, 0.2f, 1.f), hb = host_plain({5}, 1303);
  Tensor hm = host_plain({5}, 1304), hv = host_plain({5}, 1305, 0.1f, 1.f);
  for (bool relu : {false, true}) {
    auto y =
        values(*c, c->batchnorm_forward_infer(c->from_host(hx), c->from_host(hg), c->from_host(hb),
                                              c->from_host(hm), c->from_host(hv), 1e-5f, relu));
    // values() is NCHW; hx is NHWC.
    std::vector<float> want(y.size());
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t ch = 0; ch < 5; ++ch)
        for (int64_t p = 0; p < 12; ++p) {
          float v =
              bn_infer(hx.data<float>()[(n * 12 + p) * 5 + ch], hm.data<float>()[ch],
                       hv.data<float>()[ch], hg.data<float>()[ch], hb.data<float>()[ch], 1e-5f);
          want[size_t((n * 5 + ch) * 12 + p)] = relu ? relu_fwd(v) : v;
        }
  }
}

}  // namespace
