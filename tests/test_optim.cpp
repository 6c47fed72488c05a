// SGD (momentum, Nesterov, weight decay, BN/bias exclusion) against hand-computed values,
// and the LR schedules.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "engine/lr_schedule.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "layers/containers.h"
#include "layers/layers.h"

using namespace spotrain;

namespace {

// A model with one Linear (weight decays) and one BN (excluded by default).
struct Tiny {
  std::unique_ptr<Backend> be = make_backend("cpu", BackendOptions{1, true});  // 1 thread
  std::unique_ptr<Model> model;
  Tiny() {
    auto net = std::make_unique<Sequential>("");
    net->emplace<BatchNorm2d>("bn", 2, false);
    net->emplace<GlobalAvgPool>("pool");
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

TEST(Model, FlatBufferHoldsParametersInReverseLayerOrder) {
  Tiny t;
  EXPECT_EQ(t.model->offset_of(t.model->find_param("fc.bias")), 0);
  EXPECT_EQ(t.model->offset_of(t.model->find_param("fc.weight")), 1);
  EXPECT_EQ(t.model->offset_of(t.model->find_param("bn.weight")), 5);
  EXPECT_EQ(t.model->num_params(), 7);
}

TEST(LrSchedule, WarmupThenCosineToZero) {
  LrSchedule s;
  s.kind = "cosine";
  s.base_lr = 0.4f;
  s.warmup_steps = 4;
  s.total_steps = 104;
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

TEST(LrSchedule, RejectsUnknownKindAndNegativeRate) {
  LrSchedule s;
  s.kind = "linear";
  EXPECT_THROW(s.validate(), Error);
  s.kind = "cosine";
  s.base_lr = -1.f;
  EXPECT_THROW(s.validate(), Error);
}
