// SGD (momentum, Nesterov, weight decay, BN/bias exclusion) against hand-computed values,
// LARS against float64, and the LR schedules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/philox.h"
#include "engine/lr_schedule.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "layers/containers.h"
#include "layers/layers.h"

using namespace spotrain;

namespace {

// The front of the optimizer tests' models: a BN over 2 channels ("bn"), then a global average
// pool; the caller adds its Linears.
std::unique_ptr<Sequential> bn_then_pool() {
  auto net = std::make_unique<Sequential>("");
  net->emplace<BatchNorm2d>("bn", 2, false);
  net->emplace<GlobalAvgPool>("pool");
  return net;
}

// A `kind` learning-rate schedule peaking at `base_lr`, over `total` steps of which the first
// `warmup` warm up.
LrSchedule warmed_up_schedule(const std::string& kind, float base_lr, int64_t warmup, int64_t total) {
  LrSchedule s;
  s.kind = kind;
  s.base_lr = base_lr;
  s.warmup_steps = warmup;
  s.total_steps = total;
  return s;
}

// A model with one Linear (weight decays) and one BN (excluded by default).
struct Tiny {
  std::unique_ptr<Backend> be = make_backend("cpu", BackendOptions{1, true});  // 1 thread
  std::unique_ptr<Model> model;
  Tiny() {
    auto net = bn_then_pool();
    net->emplace<Linear>("fc", 2, 1);
    model = std::make_unique<Model>(std::move(net), *be);
  }
  float& p(const std::string& n, int i = 0) { return model->find_param(n)->value.data<float>()[i]; }
  float& g(const std::string& n, int i = 0) { return model->find_param(n)->grad.data<float>()[i]; }
};

}  // namespace

TEST(Sgd, MomentumWeightDecayAndExclusionsMatchHandComputedValues) {
  Tiny t;
  t.p("fc.weight") = 1.0f;
  t.p("bn.weight") = 1.0f;
  Sgd sgd(*t.model, SgdOptions{0.9f, false, 0.1f, false});
  // step 1: g = 0.5 + 0.1 * 1 = 0.6, m = 0.6, p = 1 - 0.1 * 0.6 = 0.94
  t.g("fc.weight") = 0.5f;
  t.g("bn.weight") = 0.5f;
  sgd.step(0.1f);
  EXPECT_FLOAT_EQ(t.p("fc.weight"), 0.94f);
  EXPECT_FLOAT_EQ(t.p("bn.weight"), 0.95f);  // no decay on BN: 1 - 0.1 * 0.5
  // step 2: g = 0.5 + 0.1 * 0.94 = 0.594, m = 0.9 * 0.6 + 0.594 = 1.134, p = 0.94 - 0.1134
  sgd.step(0.1f);
  EXPECT_NEAR(t.p("fc.weight"), 0.94f - 0.1134f, 1e-6);
  // BN: m = 0.9 * 0.5 + 0.5 = 0.95, p = 0.95 - 0.095
  EXPECT_NEAR(t.p("bn.weight"), 0.855f, 1e-6);
}

TEST(Sgd, DecayOnBnAndBiasWhenAsked) {
  Tiny t;
  t.p("bn.bias") = 2.0f;
  t.g("bn.bias") = 0.0f;
  Sgd sgd(*t.model, SgdOptions{0.0f, false, 0.5f, true});
  sgd.step(0.1f);
  EXPECT_FLOAT_EQ(t.p("bn.bias"), 2.0f - 0.1f * 0.5f * 2.0f);
}

TEST(Sgd, NesterovMatchesPyTorchFormula) {
  Tiny t;
  t.p("fc.weight") = 1.0f;
  Sgd sgd(*t.model, SgdOptions{0.9f, true, 0.0f, false});
  t.g("fc.weight") = 1.0f;
  sgd.step(0.1f);  // m = 1, d = g + 0.9 m = 1.9
  EXPECT_FLOAT_EQ(t.p("fc.weight"), 1.0f - 0.19f);
  sgd.step(0.1f);  // m = 0.9 + 1 = 1.9, d = 1 + 0.9 * 1.9 = 2.71
  EXPECT_NEAR(t.p("fc.weight"), 0.81f - 0.271f, 1e-6);
}

TEST(Sgd, GradScaleMultipliesGradientsFirst) {
  Tiny t;
  t.p("fc.weight") = 0.0f;
  Sgd sgd(*t.model, SgdOptions{0.0f, false, 0.0f, false});
  t.g("fc.weight") = 256.0f;
  sgd.step(1.0f, 1.0f / 256.0f);
  EXPECT_FLOAT_EQ(t.p("fc.weight"), -1.0f);
}

TEST(Sgd, RejectsBadHyperParameters) {
  Tiny t;
  EXPECT_THROW(Sgd(*t.model, SgdOptions{1.5f, false, 0.f, false}), Error);
  EXPECT_THROW(Sgd(*t.model, SgdOptions{0.9f, false, -1.f, false}), Error);
  EXPECT_THROW(Sgd(*t.model, SgdOptions{0.0f, true, 0.f, false}), Error);
}

namespace {

// Two Linears (their weights adapted, their biases not) after a BN (not adapted).
struct TwoLayers {
  std::unique_ptr<Backend> be = make_backend("cpu", BackendOptions{2, true});
  std::unique_ptr<Model> model;
  TwoLayers() {
    auto net = bn_then_pool();
    net->emplace<Linear>("fc1", 2, 3);
    net->emplace<Linear>("fc2", 3, 2);
    model = std::make_unique<Model>(std::move(net), *be);
  }
  // Fresh non-zero values everywhere, then fc2.weight's gradient zero (a layer that got none).
  void fill(uint64_t seed) {
    Philox rng(seed, 5);
    for (Param* p : model->params())
      for (int64_t i = 0; i < p->value.numel(); ++i) {
        p->value.data<float>()[i] = rng.normal();
        p->grad.data<float>()[i] = 0.1f * rng.normal();
      }
    Param* z = model->find_param("fc2.weight");
    for (int64_t i = 0; i < z->grad.numel(); ++i) z->grad.data<float>()[i] = 0.f;
  }
};

// LARS as the MLPerf reference's lars_optimizer.py computes it, in float64: per parameter
// tensor, trust = eeta |w| / (|g| + wd |w| + eps) (1 when either norm is 0), v = m v + lr trust
// (g + wd w), w -= v; tensors of BN and biases (no_decay) neither adapted nor decayed.
struct LarsReference {
  std::vector<std::vector<double>> w, v;
  LarsReference(const Model& m) {
    for (Param* p : m.params()) {
      w.emplace_back(p->value.data<float>(), p->value.data<float>() + p->value.numel());
      v.emplace_back(size_t(p->value.numel()), 0.);
    }
  }
  void step(const Model& m, double lr, const SgdOptions& o, double grad_scale) {
    for (size_t k = 0; k < m.params().size(); ++k) {
      const Param* p = m.params()[k];
      const bool adapt = !p->no_decay || o.decay_bn_and_bias;
      const double wd = adapt ? o.weight_decay : 0.;
      const float* g = p->grad.data<float>();
      double ws = 0, gs = 0;
      for (size_t i = 0; i < w[k].size(); ++i) {
        ws += w[k][i] * w[k][i];
        gs += double(g[i]) * grad_scale * double(g[i]) * grad_scale;
      }
      double trust = 1;
      if (adapt && ws > 0 && gs > 0)
        trust = o.lars_trust * std::sqrt(ws) / (std::sqrt(gs) + wd * std::sqrt(ws) + o.lars_epsilon);
      for (size_t i = 0; i < w[k].size(); ++i) {
        const double gi = double(g[i]) * grad_scale + wd * w[k][i];
        v[k][i] = o.momentum * v[k][i] + lr * trust * gi;
        w[k][i] -= o.nesterov ? o.momentum * v[k][i] + lr * trust * gi : v[k][i];
      }
    }
  }
  // Every parameter of `m` within a relative 1e-6 of the reference's (and the momentum).
  void expect_matches(const Model& m, const Tensor& momentum, const std::string& at) const {
    for (size_t k = 0; k < m.params().size(); ++k) {
      const Param* p = m.params()[k];
      const float* mv = momentum.data<float>() + m.offset_of(p);
      for (size_t i = 0; i < w[k].size(); ++i) {
        EXPECT_NEAR(p->value.data<float>()[i], w[k][i], 1e-6 * std::max(1., std::abs(w[k][i])))
            << p->name << "[" << i << "] " << at;
        EXPECT_NEAR(mv[i], v[k][i], 1e-6 * std::max(1e-2, std::abs(v[k][i]))) << p->name << "[" << i << "] momentum " << at;
      }
    }
  }
};

}  // namespace

TEST(Lars, MatchesFloat64ThroughStepsOfMomentumDecayExclusionsAndAZeroGradientLayer) {
  for (bool nesterov : {false, true}) {
    TwoLayers t;
    t.fill(41);
    SgdOptions o{0.9f, nesterov, 5e-3f, false};
    o.kind = "lars";
    Sgd lars(*t.model, o);
    LarsReference ref(*t.model);
    const float lrs[] = {4.f, 9.f, 6.5f, 2.f};
    for (int s = 0; s < 4; ++s) {
      lars.step(lrs[s], 0.5f);
      ref.step(*t.model, lrs[s], o, 0.5);
      ref.expect_matches(*t.model, lars.momentum(), str("step ", s + 1, nesterov ? " nesterov" : ""));
    }
    EXPECT_EQ(lars.steps(), 4);
    // The zero-gradient layer moved by its weight decay alone (trust 1), nothing undefined.
    for (int64_t i = 0; i < 6; ++i)
      EXPECT_TRUE(std::isfinite(t.model->find_param("fc2.weight")->value.data<float>()[i]));
  }
}

TEST(Lars, AdaptsEachWeightTensorOnItsOwnAndLeavesBnAndBiasesOut) {
  TwoLayers t;
  SgdOptions o;
  o.kind = "lars";
  Sgd lars(*t.model, o);
  int adapted = 0;
  int64_t covered = 0;
  for (const LarsSegment& s : lars.lars_segments()) {
    covered += s.count;
    if (!s.adapt) {
      EXPECT_EQ(s.weight_decay, 0.f);
      continue;
    }
    ++adapted;
    bool one_weight = false;  // exactly one parameter tensor, a weight
    for (Param* p : t.model->params())
      one_weight |= t.model->offset_of(p) == s.offset && p->value.numel() == s.count && !p->no_decay;
    EXPECT_TRUE(one_weight) << "segment at " << s.offset;
    EXPECT_EQ(s.weight_decay, o.weight_decay);
  }
  EXPECT_EQ(adapted, 2);  // fc1.weight, fc2.weight
  EXPECT_EQ(covered, t.model->num_params());
  // With --decay-bn-bias every tensor is adapted and decayed, each on its own.
  o.decay_bn_and_bias = true;
  Sgd all(*t.model, o);
  EXPECT_EQ(all.lars_segments().size(), t.model->params().size());
  for (const LarsSegment& s : all.lars_segments()) EXPECT_TRUE(s.adapt);
  // ... and matches float64 so.
  t.fill(43);
  LarsReference ref(*t.model);
  all.step(3.f);
  ref.step(*t.model, 3., o, 1.);
  ref.expect_matches(*t.model, all.momentum(), "decay-bn-bias");
}

TEST(Lars, SkippedStepLeavesEverythingAsItWas) {
  TwoLayers t;
  t.fill(44);
  SgdOptions o;
  o.kind = "lars";
  Sgd lars(*t.model, o);
  Tensor bad = t.be->zeros({4});
  t.be->fill(bad, std::numeric_limits<float>::infinity());
  t.be->unscale_check_queue(bad, 1.f);
  const std::vector<float> before(t.model->flat_params().data<float>(),
                                  t.model->flat_params().data<float>() + t.model->num_params());
  lars.step(5.f, 1.f, /*unless_overflow=*/true);
  for (int64_t i = 0; i < t.model->num_params(); ++i)
    EXPECT_EQ(t.model->flat_params().data<float>()[i], before[size_t(i)]);
  EXPECT_EQ(lars.momentum().data<float>()[0], 0.f);
  EXPECT_EQ(lars.steps(), 0);
}

TEST(Lars, RejectsUnknownOptimizerAndBadTrust) {
  Tiny t;
  SgdOptions o;
  o.kind = "adam";
  EXPECT_THROW(Sgd(*t.model, o), Error);
  o.kind = "lars";
  o.lars_trust = 0.f;
  EXPECT_THROW(Sgd(*t.model, o), Error);
  o.lars_trust = 0.001f;
  o.lars_epsilon = -1.f;
  EXPECT_THROW(Sgd(*t.model, o), Error);
}

TEST(Model, FlatBufferHoldsParametersInReverseLayerOrder) {
  Tiny t;
  EXPECT_EQ(t.model->offset_of(t.model->find_param("fc.bias")), 0);
  EXPECT_EQ(t.model->offset_of(t.model->find_param("fc.weight")), 1);
  EXPECT_EQ(t.model->offset_of(t.model->find_param("bn.weight")), 5);
  EXPECT_EQ(t.model->num_params(), 7);
}

TEST(LrSchedule, WarmupThenCosineToZero) {
  LrSchedule s = warmed_up_schedule("cosine", 0.4f, 4, 104);
  EXPECT_FLOAT_EQ(s.at(0), 0.1f);
  EXPECT_FLOAT_EQ(s.at(3), 0.4f);
  EXPECT_FLOAT_EQ(s.at(4), 0.4f);
  EXPECT_NEAR(s.at(54), 0.2f, 1e-6);
  EXPECT_NEAR(s.at(104), 0.0f, 1e-7);
}

TEST(LrSchedule, StepDecaysAtMilestones) {
  LrSchedule s;
  s.kind = "step";
  s.base_lr = 1.0f;
  s.milestones = {10, 20};
  EXPECT_FLOAT_EQ(s.at(9), 1.0f);
  EXPECT_FLOAT_EQ(s.at(10), 0.1f);
  EXPECT_NEAR(s.at(25), 0.01f, 1e-8);
}

// MLPerf's PolynomialDecayWithWarmup (lars_util.py) after spotrain's linear warm-up:
// (base - end) * (1 - progress)^power + end, progress over the steps after the warm-up.
TEST(LrSchedule, PolyDecaysFromThePeakToTheEndRateAfterWarmup) {
  LrSchedule s = warmed_up_schedule("poly", 1.0f, 10, 110);
  s.end_lr = 0.0001f;
  s.poly_power = 2.f;
  s.validate();
  EXPECT_FLOAT_EQ(s.at(0), 0.1f);    // warm-up
  EXPECT_FLOAT_EQ(s.at(4), 0.5f);
  EXPECT_FLOAT_EQ(s.at(9), 1.0f);
  EXPECT_FLOAT_EQ(s.at(10), 1.0f);   // the peak, progress 0
  EXPECT_NEAR(s.at(60), 0.9999 * 0.25 + 0.0001, 1e-7);  // middle: (1 - 1/2)^2
  EXPECT_NEAR(s.at(85), 0.9999 * 0.0625 + 0.0001, 1e-7);
  EXPECT_NEAR(s.at(109), 0.9999 * 1e-4 + 0.0001, 1e-8);  // the last step trained
  EXPECT_FLOAT_EQ(s.at(110), 0.0001f);  // the end
  EXPECT_FLOAT_EQ(s.at(500), 0.0001f);
  s.poly_power = 1.f;
  EXPECT_NEAR(s.at(60), 0.9999 * 0.5 + 0.0001, 1e-7);
  s.warmup_steps = 0;
  EXPECT_FLOAT_EQ(s.at(0), 1.0f);
  s.poly_power = 0.f;
  EXPECT_THROW(s.validate(), Error);
  s.poly_power = 2.f;
  s.end_lr = -1.f;
  EXPECT_THROW(s.validate(), Error);
}

TEST(LrSchedule, RejectsUnknownKindAndNegativeRate) {
  LrSchedule s;
  s.kind = "linear";
  EXPECT_THROW(s.validate(), Error);
  s.kind = "cosine";
  s.base_lr = -1.f;
  EXPECT_THROW(s.validate(), Error);
}
