// Residual blocks on the CPU backend: finite differences of the input and
// the parameters, the tail batch norm's fused Add and ReLU and the first convolution adding into
// the shortcut's gradient (seen through an OpProfiler), and gradient checkpointing: every mode
// gives bitwise the same gradients and running statistics as the plain graph.
// Inputs are fresh Philox draws (never zeros); outputs and gradients are NaN-poisoned first.
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <set>

#include "comm/communicator.h"
#include "core/environment.h"
#include "engine/fast_paths.h"
#include "engine/fusion_choice.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/kernel_cache.h"
#include "kernels/wrong_op_backend.h"
#include "fmnist_resnet.h"
#include "layer_test_util.h"
#include "layers/fusion_chain.h"

using namespace spotrain;

namespace {

// ============================================================================================
// Residual blocks: finite differences of the input and of parameters.
// ============================================================================================

// Random values for every parameter of a standalone layer graph (gradients poisoned).
void randomize_params(Layer& l, uint32_t stream) {
  std::vector<Param*> ps;
  l.collect_params(ps);
  for (size_t i = 0; i < ps.size(); ++i) {
    Param* p = ps[i];
    int64_t n = p->value.numel();
    uint32_t st = stream + uint32_t(i);
    switch (p->init) {
      case Param::Init::kaiming_fan_out:
        set_param(*p, normals(n, st, std::sqrt(2.f / float(p->fan))));
        break;
      case Param::Init::uniform_fan_in:
        set_param(*p, uniforms(n, st, -0.5f, 0.5f));
        break;
      case Param::Init::ones:
        set_param(*p, uniforms(n, st, 0.5f, 1.5f));
        break;
      case Param::Init::zeros:
        set_param(*p, normals(n, st, 0.3f));
        break;
    }
  }
}

// A blocked-layout input of shape `s`, normal values from `stream`.
Tensor random_input(const Shape& s, uint32_t stream) {
  return make_tensor(normals(shape_numel(s), stream), s, Layout::blocked);
}

// The gradients a backward left on `block`'s parameters, then its input gradient `dx`.
std::vector<Vec> grads_of(Backend& be, Layer& block, const Tensor& dx) {
  std::vector<Param*> ps;
  block.collect_params(ps);
  std::vector<Vec> grads;
  for (Param* p : ps) grads.push_back(to_vec(p->grad));
  grads.push_back(values(be, dx));
  return grads;
}

// --fusion as the engine builds the model with it (fusion_mode, on the CPU at fp32): none, bn
// (linked and fused) or auto (linked and apart, each chain to be switched).
void set_fusion_option(ResNetOptions& o, const std::string& fusion) {
  static const std::unique_ptr<Backend> be = cpu_backend(1);
  const FusionMode p = fusion_mode(fusion, *be, DType::f32);
  EXPECT_FALSE(p.choose) << "the CPU composes the fused ops: nothing to time";
  o.fusion_links = p.links;
  o.fusion_on = p.on;
}

// A block of resnet20 as build_resnet makes it: stage 0..2, block index.
std::unique_ptr<Layer> resnet20_block(int stage, int index, const char* fusion = "none") {
  ResNetOptions o;
  o.arch = "resnet20";
  set_fusion_option(o, fusion);
  auto net = build_resnet(o);
  auto layers = net->release();  // conv1, bn1, layer1, layer2, layer3, avgpool, fc
  auto* st = dynamic_cast<Sequential*>(layers.at(size_t(2 + stage)).get());
  if (!st) return nullptr;
  auto blocks = st->release();
  return std::move(blocks.at(size_t(index)));
}

// A torchvision Bottleneck (v1.5, stride on the 3x3) assembled as resnet.cpp does it; `fused`:
// with --fusion bn's two links (conv1, bn1, conv2) and (conv2, bn2, conv3).
std::unique_ptr<Layer> bottleneck(int in, int planes, int stride, bool fused = false) {
  auto main = std::make_unique<Sequential>("b");
  main->emplace<Conv2d>("b.conv1", in, planes, 1, 1, 0);
  main->emplace<BatchNorm2d>("b.bn1", planes, true);
  main->emplace<Conv2d>("b.conv2", planes, planes, 3, stride, 1);
  main->emplace<BatchNorm2d>("b.bn2", planes, true);
  main->emplace<Conv2d>("b.conv3", planes, planes * 4, 1, 1, 0);
  main->emplace<BatchNorm2d>("b.bn3", planes * 4, false);
  auto conv = [&](size_t i) -> Conv2d& { return dynamic_cast<Conv2d&>(main->at(i)); };
  auto bn = [&](size_t i) -> BatchNorm2d& { return dynamic_cast<BatchNorm2d&>(main->at(i)); };
  // Linked as the model links them, switched on or not.
  fuse_conv_bn_conv(conv(0), bn(1), conv(2), fused);
  fuse_conv_bn_conv(conv(2), bn(3), conv(4), fused);
  auto sc = std::make_unique<Sequential>("b.downsample");
  sc->emplace<Conv2d>("b.downsample.0", in, planes * 4, 1, stride, 0);
  sc->emplace<BatchNorm2d>("b.downsample.1", planes * 4, false);
  return std::make_unique<Residual>("b", std::move(main), std::move(sc));
}

struct BlockCase {
  const char* name;
  std::function<std::unique_ptr<Layer>()> make;
  int n, c, h, w;
};

class ResidualBlockTest : public ::testing::TestWithParam<BlockCase> {};

TEST_P(ResidualBlockTest, FiniteDifferencesOfInputAndParameters) {
  const BlockCase& bc = GetParam();
  auto be = cpu_backend();
  std::unique_ptr<Layer> block = bc.make();
  ASSERT_TRUE(block);
  randomize_params(*block, 140);
  std::vector<Param*> ps;
  block->collect_params(ps);
  Shape s{bc.n, bc.c, bc.h, bc.w};
  Tensor xt = random_input(s, 141);
  Context ctx = train_ctx(*be);
  Tensor y = block->forward(xt, ctx);
  Floats r = normals(y.numel(), 142);
  poison_pool({xt.storage_elems()});
  Tensor dxt = block->backward(make_like(r, y), ctx);
  ASSERT_TRUE(dxt.defined());
  EXPECT_TRUE(zero_padding(dxt));
  Vec dx = values(*be, dxt);
  auto loss = [&] {
    for (auto* p : ps) p->value.mark_written();  // finite_diff moved a weight
    return dot(values(*be, block->forward(xt, ctx)), r);
  };
  // A step may cross a ReLU kink (the one-sided slopes then disagree): such elements are
  // skipped, but most must be checked. Steps: 1e-2 for an input element (it moves few
  // outputs, so fp32 rounding of the loss dominates a smaller step), 1e-3 for a parameter
  // (it moves a whole channel, so a larger step crosses kinks).
  int checked = 0, tried = 0;
  auto check = [&](float& v, double eps, double an, double scale, const std::string& what) {
    ++tried;
    Fd fd = finite_diff(loss, v, eps);
    if (std::fabs(fd.plus - fd.minus) > 0.02 * (std::fabs(an) + scale)) return;  // a kink
    ++checked;
    EXPECT_TRUE(fd_agrees(fd.central, an, 1e-2, scale)) << what;
  };
  for (int64_t i : pick(shape_numel(s), 8, 143))
    check(xt.data<float>()[offset_of(xt, i)], 1e-2, dx[size_t(i)], rms(dx),
          "x[" + std::to_string(i) + "]");
  for (size_t k = 0; k < ps.size(); ++k) {
    Param* p = ps[k];
    Vec g = to_vec(p->grad);
    for (double v : g) ASSERT_FALSE(std::isnan(v)) << p->name << " gradient not written";
    for (int64_t i : pick(p->value.numel(), 2, 144 + uint32_t(k)))
      check(p->value.data<float>()[i], 1e-3, g[size_t(i)], rms(g),
            p->name + "[" + std::to_string(i) + "]");
  }
  EXPECT_GE(checked, tried * 8 / 10) << "too many elements sat on a ReLU kink";
}

INSTANTIATE_TEST_SUITE_P(
    Blocks, ResidualBlockTest,
    ::testing::Values(
        BlockCase{"basic_identity", [] { return resnet20_block(0, 0); }, 2, 16, 6, 6},
        BlockCase{"basic_downsample", [] { return resnet20_block(1, 0); }, 2, 16, 7, 7},
        BlockCase{"bottleneck_downsample", [] { return bottleneck(8, 4, 2); }, 2, 8, 7, 7},
        BlockCase{"bottleneck_stride1", [] { return bottleneck(8, 4, 1); }, 2, 8, 5, 5},
        // --fusion bn: the batch norms the next convolution applies as it reads
        BlockCase{"basic_fused", [] { return resnet20_block(1, 0, "bn"); }, 2, 16, 7, 7},
        BlockCase{"bottleneck_fused", [] { return bottleneck(8, 4, 2, true); }, 2, 8, 7, 7}),
    [](const ::testing::TestParamInfo<BlockCase>& i) { return std::string(i.param.name); });

// A residual block's last BN takes the shortcut and does Add and ReLU in one backend op
// (batchnorm_add_relu_*), its first convolution adds its input gradient to the shortcut's
// (conv2d_backward_data_add), and an attached OpProfiler sees every op of the block, an op
// composed of others once, without changing a bit of what it computes.
TEST(ResidualBlock, TailBatchNormAddsTheShortcutInOneOpAndTheProfileCountsEveryOp) {
  auto run = [](Backend& be, std::vector<Vec>* grads) {
    std::unique_ptr<Layer> block = bottleneck(8, 4, 2);
    randomize_params(*block, 150);
    Tensor x = random_input({2, 8, 7, 7}, 151);
    Context ctx = train_ctx(be);
    Tensor y = block->forward(x, ctx);
    Vec out = values(be, y);
    Tensor dx = block->backward(make_like(normals(y.numel(), 152), y), ctx);
    *grads = grads_of(be, *block, dx);
    return out;
  };
  auto plain = cpu_backend();
  std::vector<Vec> g0, g1;
  Vec y0 = run(*plain, &g0);
  auto profiled = cpu_backend();
  OpProfiler prof(*profiled);
  Vec y1 = run(*profiled, &g1);
  prof.collect(true);
  EXPECT_EQ(y1, y0);
  EXPECT_EQ(g1, g0);
  std::map<std::string, double> calls;
  double total_ms = 0;
  for (const auto& r : prof.by_op()) {
    calls[r.name] = r.calls_per_step;
    total_ms += r.ms_per_step;
  }
  EXPECT_GT(total_ms, 0.0) << "the host clock timed nothing";
  EXPECT_EQ(calls["conv2d_forward"], 4);  // three on the main branch, one on the shortcut
  EXPECT_EQ(calls["conv2d_backward_weights"], 4);
  EXPECT_EQ(calls["batchnorm_add_relu_forward"], 1);
  EXPECT_EQ(calls["batchnorm_add_relu_backward"], 1);
  EXPECT_EQ(calls.count("add_forward+relu"), 0u) << "the block's Add ran on its own";
  // The input gradient, main + shortcut: the main branch's first convolution adds its own to
  // the shortcut's.
  EXPECT_EQ(calls["conv2d_backward_data_add"], 1);
  EXPECT_EQ(calls["conv2d_backward_data"], 3);  // conv2, conv3, the shortcut's
  EXPECT_EQ(calls["add_forward"], 0);
  EXPECT_FALSE(prof.report().empty());
}

// Largest difference between a and b relative to b's RMS.
double rel_diff(const Vec& a, const Vec& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d / std::max(rms(b), 1e-30);
}

// --fusion bn on a bottleneck: the plain block's output, gradients and running statistics up
// to rounding, through the fused ops: conv1 makes bn1's statistics as it writes, conv2 and
// conv3 apply bn1 and bn2 with their ReLU as they read, and those two batch norms never run a
// forward or backward of their own (conv2's and conv3's backward go through them).
TEST(ConvBnFusion, BottleneckMatchesThePlainBlockThroughTheFusedOps) {
  struct Outcome {
    Vec y;
    std::vector<Vec> grads, buffers;
    std::map<std::string, double> calls;
  };
  auto run = [](bool fused) {
    auto be = cpu_backend();
    std::unique_ptr<Layer> block = bottleneck(8, 4, 2, fused);
    randomize_params(*block, 150);
    Tensor x = random_input({2, 8, 7, 7}, 151);
    Outcome o;
    OpProfiler prof(*be);
    Context ctx = train_ctx(*be);
    Tensor y = block->forward(x, ctx);
    Tensor dx = block->backward(make_like(normals(y.numel(), 152), y), ctx);
    prof.collect(true);
    for (const auto& r : prof.by_op()) o.calls[r.name] = r.calls_per_step;
    o.y = values(*be, y);
    o.grads = grads_of(*be, *block, dx);
    std::vector<Buffer*> bs;
    block->collect_buffers(bs);
    for (Buffer* b : bs) o.buffers.push_back(to_vec(b->value));
    return o;
  };
  Outcome plain = run(false), fused = run(true);
  EXPECT_LT(rel_diff(fused.y, plain.y), 1e-5);
  ASSERT_EQ(fused.grads.size(), plain.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i)
    EXPECT_LT(rel_diff(fused.grads[i], plain.grads[i]), 1e-4) << "gradient " << i;
  ASSERT_EQ(fused.buffers.size(), plain.buffers.size());
  for (size_t i = 0; i < plain.buffers.size(); ++i)
    EXPECT_LT(rel_diff(fused.buffers[i], plain.buffers[i]), 1e-5) << "buffer " << i;

  EXPECT_EQ(plain.calls["batchnorm_forward+relu"], 2);
  EXPECT_EQ(plain.calls.count("conv2d_forward+stats"), 0u);
  EXPECT_EQ(fused.calls.count("batchnorm_forward+relu"), 0u) << "bn1 or bn2 ran on its own";
  EXPECT_EQ(fused.calls["conv2d_forward+stats"], 1);          // conv1
  EXPECT_EQ(fused.calls["bn_relu+conv2d_forward+stats"], 2);  // conv2, conv3
  EXPECT_EQ(fused.calls["conv2d_forward"], 1);                 // the shortcut's
  EXPECT_EQ(fused.calls["batchnorm_add_relu_forward"], 1);     // bn3, as before
  // Backward through conv2 and bn1 (and conv3 and bn2) at once.
  EXPECT_EQ(fused.calls["conv2d_backward+bn_relu"], 2);
  EXPECT_EQ(fused.calls["conv2d_backward_weights"], 2);  // conv1, the shortcut's
  EXPECT_EQ(fused.calls.count("batchnorm_backward"), 1u);  // only the shortcut's own
  EXPECT_EQ(plain.calls["batchnorm_backward+relu"], 2);
}

// The CPU makes a batch norm + ReLU's output again in the backward of the convolution that
// read it (Backend::remakes_bn_relu_inputs) instead of keeping it: the same output and
// gradients as keeping it (SPOTRAIN_KEEP_BN_RELU_OUTPUTS=1), with conv2's and conv3's inputs
// (bn1's and bn2's outputs) no longer alive at the end of the forward.
TEST(RemadeBnReluInputs, GiveTheKeptGradientsWithTwoActivationsLessAlive) {
  struct Outcome {
    Vec y;
    std::vector<Vec> grads;
    size_t held_after_forward = 0;
    double infer_calls = 0;
  };
  auto run = [](bool keep) {
    test_hooks_for_test().keep_bn_relu_outputs = keep;
    auto be = cpu_backend();
    test_hooks_for_test().keep_bn_relu_outputs = false;
    EXPECT_EQ(be->remakes_bn_relu_inputs(), !keep);
    std::unique_ptr<Layer> block = bottleneck(32, 32, 1, false);
    randomize_params(*block, 160);
    Tensor x = random_input({4, 32, 14, 14}, 161);
    Outcome o;
    OpProfiler prof(*be);
    Context ctx = train_ctx(*be);
    const size_t before = Allocator::host().stats().current_bytes;
    Tensor y = block->forward(x, ctx);
    o.held_after_forward = Allocator::host().stats().current_bytes - before;
    Tensor dx = block->backward(make_like(normals(y.numel(), 162), y), ctx);
    prof.collect(true);
    for (const auto& r : prof.by_op())
      if (r.name == "batchnorm_infer") o.infer_calls = r.calls_per_step;
    o.y = values(*be, y);
    o.grads = grads_of(*be, *block, dx);
    return o;
  };
  Outcome kept = run(true), remade = run(false);
  EXPECT_EQ(remade.y, kept.y);
  ASSERT_EQ(remade.grads.size(), kept.grads.size());
  for (size_t i = 0; i < kept.grads.size(); ++i)
    EXPECT_LT(rel_diff(remade.grads[i], kept.grads[i]), 1e-5) << "gradient " << i;
  EXPECT_EQ(kept.infer_calls, 0);
  EXPECT_EQ(remade.infer_calls, 2);  // conv2's and conv3's inputs, made again
  // bn1's and bn2's outputs: 32 channels of 4x14x14 each (fp32), no longer held.
  const size_t act = size_t(4) * 32 * 14 * 14 * sizeof(float);
  EXPECT_GE(kept.held_after_forward, remade.held_after_forward + 2 * act);
}

// ============================================================================================
// Gradient checkpointing: bitwise the same gradients and running statistics.
// ============================================================================================

struct StepOutcome {
  std::vector<std::string> names;
  std::vector<Floats> logits, grads, buffers;  // per step; buffers after the last step
  std::vector<double> losses;
  Floats eval_logits;
  std::map<std::string, double> calls;  // per training step, by op (when convs was asked)
};

Floats host_floats(Backend& be, const Tensor& t) {
  Tensor h = be.to_host(t);
  return Floats(h.data<float>(), h.data<float>() + h.numel());
}

// Two training steps and an evaluation of resnet20; with `convs`, the convolutions run in a
// training step (forward, replays included).
StepOutcome resnet20_steps(Backend& be, const std::string& mode,
                           const std::string& fusion = "none", double* convs = nullptr,
                           const std::function<void(Model&)>& prepare = nullptr) {
  ResNetOptions o = fmnist_resnet20();
  set_fusion_option(o, fusion);
  o.grad_checkpoint = mode;
  Model m(build_resnet(o), be);
  m.initialize(4242);
  if (prepare) prepare(m);
  StepOutcome out;
  for (auto* p : m.params()) out.names.push_back(p->name);
  int N = 4;
  std::vector<int32_t> labels = {3, 7, 0, 9};
  std::unique_ptr<OpProfiler> prof;
  if (convs) prof = std::make_unique<OpProfiler>(be);
  for (int step = 0; step < 2; ++step) {
    Tensor x = make_tensor(normals(int64_t(N) * 12 * 12, 170 + uint32_t(step)), {N, 1, 12, 12},
                           Layout::nhwc);
    Tensor logits = m.forward(be.upload_images(x), true);
    Tensor dl;
    out.losses.push_back(be.softmax_xent(logits, labels.data(), 0.1f, 1.f, &dl).loss);
    out.logits.push_back(host_floats(be, logits));
    be.fill(m.flat_grads(), kNaN);  // every gradient must be overwritten
    m.backward(dl);
    out.grads.push_back(host_floats(be, m.flat_grads()));
    if (prof) prof->collect(true);
  }
  if (prof) {
    *convs = 0;
    for (const auto& r : prof->by_op()) {
      if (r.name.find("conv2d_forward") != std::string::npos) *convs += r.calls_per_step;
      out.calls[r.name] = r.calls_per_step;
    }
    prof.reset();
  }
  for (auto* b : m.buffers()) {
    Floats v = host_floats(be, b->value);
    out.buffers.insert(out.buffers.end(), v);
  }
  Tensor x = make_tensor(normals(int64_t(N) * 12 * 12, 180), {N, 1, 12, 12}, Layout::nhwc);
  out.eval_logits = host_floats(be, m.forward(be.upload_images(x), false));
  return out;
}

bool bitwise_equal(const Floats& a, const Floats& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// `got` trained as `want` bit for bit: each step's logits and gradients, and the running
// statistics after the last step.
void expect_bitwise_same_steps(const StepOutcome& got, const StepOutcome& want) {
  for (size_t s = 0; s < want.grads.size(); ++s) {
    EXPECT_TRUE(bitwise_equal(got.logits[s], want.logits[s])) << "logits, step " << s;
    EXPECT_TRUE(bitwise_equal(got.grads[s], want.grads[s])) << "gradients, step " << s;
  }
  for (size_t b = 0; b < want.buffers.size(); ++b)
    EXPECT_TRUE(bitwise_equal(got.buffers[b], want.buffers[b])) << "buffer " << b;
}

class Checkpointing : public ::testing::TestWithParam<int> {};  // compute threads

TEST_P(Checkpointing, ModesGiveBitwiseIdenticalGradientsAndStatistics) {
  auto be = cpu_backend(GetParam());
  StepOutcome ref = resnet20_steps(*be, "none");
  for (const Floats& g : ref.grads) {
    size_t nan = size_t(std::count_if(g.begin(), g.end(), [](float v) { return std::isnan(v); }));
    EXPECT_EQ(nan, 0u) << "gradient elements left unwritten";
    EXPECT_GT(rms(to_vec(g)), 0.0);
  }
  for (const char* mode : {"selective", "block", "stage", "every:2"}) {
    SCOPED_TRACE(mode);
    StepOutcome got = resnet20_steps(*be, mode);
    ASSERT_EQ(got.names, ref.names);
    for (size_t s = 0; s < ref.grads.size(); ++s) {
      EXPECT_EQ(got.losses[s], ref.losses[s]) << "step " << s;
      EXPECT_TRUE(bitwise_equal(got.logits[s], ref.logits[s])) << "logits, step " << s;
      EXPECT_TRUE(bitwise_equal(got.grads[s], ref.grads[s])) << "gradients, step " << s;
    }
    ASSERT_EQ(got.buffers.size(), ref.buffers.size());
    for (size_t b = 0; b < ref.buffers.size(); ++b)
      EXPECT_TRUE(bitwise_equal(got.buffers[b], ref.buffers[b])) << "buffer " << b;
    EXPECT_TRUE(bitwise_equal(got.eval_logits, ref.eval_logits)) << "eval logits";
  }
  if (GetParam() == 1) return;
  // Against one thread: the same numbers up to summation order.
  auto one = cpu_backend(1);
  StepOutcome single = resnet20_steps(*one, "none");
  for (size_t s = 0; s < ref.grads.size(); ++s) {
    EXPECT_TRUE(close(to_vec(ref.logits[s]), to_vec(single.logits[s]), 1e-4)) << "step " << s;
    EXPECT_TRUE(close(to_vec(ref.grads[s]), to_vec(single.grads[s]), 1e-4)) << "step " << s;
  }
}

// --fusion bn over two steps of resnet20: the plain model's numbers up to rounding, and under
// gradient checkpointing bitwise its own (a replay hands the same statistics on, and never
// counts them twice in the running statistics).
TEST(ConvBnFusion, ResNet20StepsMatchThePlainModelAndCheckpointingReplaysThemExactly) {
  auto be = cpu_backend(1);
  StepOutcome plain = resnet20_steps(*be, "none");
  StepOutcome fused = resnet20_steps(*be, "none", "bn");
  ASSERT_EQ(fused.names, plain.names) << "fusion changed the parameters a checkpoint holds";
  for (size_t s = 0; s < plain.grads.size(); ++s) {
    EXPECT_NEAR(fused.losses[s], plain.losses[s], 1e-5 * std::fabs(plain.losses[s]));
    EXPECT_LT(rel_diff(to_vec(fused.logits[s]), to_vec(plain.logits[s])), 1e-4) << "step " << s;
    EXPECT_LT(rel_diff(to_vec(fused.grads[s]), to_vec(plain.grads[s])), 1e-3) << "step " << s;
    size_t nan = size_t(std::count_if(fused.grads[s].begin(), fused.grads[s].end(),
                                      [](float v) { return std::isnan(v); }));
    EXPECT_EQ(nan, 0u) << "gradient elements left unwritten";
  }
  ASSERT_EQ(fused.buffers.size(), plain.buffers.size());
  for (size_t b = 0; b < plain.buffers.size(); ++b)
    EXPECT_LT(rel_diff(to_vec(fused.buffers[b]), to_vec(plain.buffers[b])), 1e-4) << "buffer " << b;
  EXPECT_LT(rel_diff(to_vec(fused.eval_logits), to_vec(plain.eval_logits)), 1e-3);

  StepOutcome replayed = resnet20_steps(*be, "block", "bn");
  expect_bitwise_same_steps(replayed, fused);
}

// --grad-checkpoint selective replays batch norm, ReLU and Add but hands the kept convolution
// outputs back: resnet20's replays convolve again only the stem's convolution and the projection
// shortcut of layer2.0 (a 1x1 that doubles the channels); its first stage, replayed block by
// block inside its own replay, convolves nothing again. `stage` convolves its three segments
// again. With --fusion bn the kept outputs carry their batch statistics along.
TEST(SelectiveCheckpointing, ReplaysConvolveOnlyTheCheapConvolutionsAgain) {
  auto be = cpu_backend(1);
  double none = 0, selective = 0, stage = 0, fused = 0;
  resnet20_steps(*be, "none", "none", &none);
  resnet20_steps(*be, "selective", "none", &selective);
  resnet20_steps(*be, "stage", "none", &stage);
  EXPECT_EQ(none, 21);  // the stem's, 2 in each of 9 blocks, 2 projection shortcuts
  EXPECT_EQ(selective, none + 2);
  EXPECT_EQ(stage, none + 1 + 6 + 7);  // the stem, layer1, layer2 (layer3 is the last segment)

  StepOutcome fused_none = resnet20_steps(*be, "none", "bn");
  StepOutcome fused_sel = resnet20_steps(*be, "selective", "bn", &fused);
  EXPECT_EQ(fused, none + 2);
  expect_bitwise_same_steps(fused_sel, fused_none);
}

// --fusion auto links the chains as bn does and switches each on or off: all off is the plain
// model bit for bit (under selective checkpointing too: a convolution keeps its output for its
// statistics only while its chain is on), and any mix of on and off the plain model's numbers
// up to rounding.
TEST(FusionAuto, ChainsSwitchedOffAreThePlainModelAndAnyMixTrainsAlike) {
  auto be = cpu_backend(1);
  auto all_off = [](Model& m) { set_fusion(m, false); };
  for (const char* mode : {"none", "selective"}) {
    SCOPED_TRACE(mode);
    StepOutcome plain = resnet20_steps(*be, mode);
    StepOutcome off = resnet20_steps(*be, mode, "auto", nullptr, all_off);
    for (size_t s = 0; s < plain.grads.size(); ++s) {
      EXPECT_EQ(off.losses[s], plain.losses[s]) << "step " << s;
      EXPECT_TRUE(bitwise_equal(off.grads[s], plain.grads[s])) << "gradients, step " << s;
    }
    for (size_t b = 0; b < plain.buffers.size(); ++b)
      EXPECT_TRUE(bitwise_equal(off.buffers[b], plain.buffers[b])) << "buffer " << b;
  }
  int switched = 0;
  auto alternate = [&switched](Model& m) {
    std::vector<FusionChain> chains = fusion_chains(m.net());
    ASSERT_EQ(chains.size(), 9u);  // one per basic block
    for (size_t i = 0; i < chains.size(); ++i) chains[i].set_fused(i % 2 == 0);
    for (size_t i = 0; i < chains.size(); ++i) switched += chains[i].fused() == (i % 2 == 0);
  };
  StepOutcome plain = resnet20_steps(*be, "none");
  double convs = 0;
  StepOutcome mixed = resnet20_steps(*be, "none", "auto", &convs, alternate);
  EXPECT_EQ(switched, 9);
  // Five chains fused: each one's first convolution makes statistics, its second applies them;
  // its backward runs through both of the second's ops at once.
  EXPECT_EQ(mixed.calls["conv2d_forward+stats"], 5);
  EXPECT_EQ(mixed.calls["bn_relu+conv2d_forward+stats"], 5);
  EXPECT_EQ(mixed.calls["conv2d_backward+bn_relu"], 5);
  for (size_t s = 0; s < plain.grads.size(); ++s) {
    EXPECT_NEAR(mixed.losses[s], plain.losses[s], 1e-5 * std::fabs(plain.losses[s]));
    EXPECT_LT(rel_diff(to_vec(mixed.grads[s]), to_vec(plain.grads[s])), 1e-3) << "step " << s;
  }
}

// A ResNet built with --fusion auto (its chains linked, each still to be switched).
std::unique_ptr<Model> auto_fused_resnet(Backend& be, const std::string& arch, int in_channels,
                                         uint64_t seed) {
  ResNetOptions o;
  o.arch = arch;
  set_fusion_option(o, "auto");
  o.in_channels = in_channels;
  auto m = std::make_unique<Model>(build_resnet(o), be);
  m->initialize(seed);
  return m;
}

// The verdict for the chain named `chain` (the test fails where there is none).
FusionVerdict verdict_of(const std::vector<FusionVerdict>& v, const std::string& chain) {
  auto it = std::find_if(v.begin(), v.end(), [&](const FusionVerdict& f) { return f.chain == chain; });
  EXPECT_NE(it, v.end()) << chain;
  return it == v.end() ? FusionVerdict{} : *it;
}

// choose_fusion times every chain both ways on the inputs a scratch training forward meets (on
// the CPU here, which the engine itself never times), once per shape, checks in the same runs
// that the fused chain computes what its layers apart do (on the CPU both compose the same
// ops: the check passes and is recorded so), switches each as its verdict says, and changes
// no weight, running statistic or gradient.
TEST(FusionAuto, TimingGivesEachChainAVerdictChecksItAndTouchesNoState) {
  auto be = cpu_backend(1);
  const auto model = auto_fused_resnet(*be, "resnet20", 1, 7);
  Model& m = *model;
  const Floats p0 = host_floats(*be, m.flat_params()), b0 = host_floats(*be, m.flat_buffers());
  be->fill(m.flat_grads(), 0.25f);
  Tensor x = be->upload_images(make_tensor(normals(8 * 12 * 12, 90), {8, 1, 12, 12}, Layout::nhwc));
  FastPathChecks checks("", "cpu test");
  const std::vector<FusionVerdict> v = choose_fusion(m, x, &checks);
  EXPECT_TRUE(checks.checked(kFastPathFusion));
  EXPECT_FALSE(checks.off(kFastPathFusion)) << checks.why_off(kFastPathFusion);
  ASSERT_EQ(v.size(), 9u);
  std::vector<FusionChain> chains = fusion_chains(m.net());
  std::set<std::string> names;
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_GT(v[i].fused_ms, 0.0) << v[i].chain;
    EXPECT_GT(v[i].apart_ms, 0.0) << v[i].chain;
    EXPECT_EQ(v[i].fused, v[i].fused_ms <= kFusionWinsBelow * v[i].apart_ms) << v[i].chain;
    names.insert(v[i].chain);
  }
  EXPECT_EQ(names.size(), 9u);
  EXPECT_TRUE(names.count("layer1.0.conv1+bn1+conv2")) << *names.begin();
  for (const FusionChain& c : chains) EXPECT_EQ(c.fused(), verdict_of(v, c.name()).fused) << c.name();
  // layer1's three blocks share a shape: timed once, the same figures for all three.
  const FusionVerdict first = verdict_of(v, "layer1.0.conv1+bn1+conv2"),
                      third = verdict_of(v, "layer1.2.conv1+bn1+conv2");
  EXPECT_EQ(first.fused_ms, third.fused_ms);
  EXPECT_EQ(first.apart_ms, third.apart_ms);
  EXPECT_TRUE(bitwise_equal(host_floats(*be, m.flat_params()), p0)) << "weights changed";
  EXPECT_TRUE(bitwise_equal(host_floats(*be, m.flat_buffers()), b0)) << "running statistics changed";
  const Floats g = host_floats(*be, m.flat_grads());
  EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float f) { return f == 0.25f; })) << "gradients written";
  EXPECT_NE(fusion_summary(v).find("of 9 conv + BN+ReLU + conv chains fused"), std::string::npos)
      << fusion_summary(v);
}

// ---- --fusion auto's first-use check, kernel cache and ranks --------------------------------

// SPOTRAIN_WRONG_OP for the test's length: a backend wrapped by plant_wrong_ops
// (kernels/wrong_op_backend.h) doubles the named op's output.
class PlantWrongOp {
 public:
  explicit PlantWrongOp(const std::string& op) { test_hooks_for_test().wrong_ops = {op}; }
  ~PlantWrongOp() { test_hooks_for_test().wrong_ops.clear(); }
};

// The CPU backend with a kernel cache (a GPU's has one; the CPU's has none) and a count of the
// fused forward ops it ran; from `cut_after` fused forwards on (-1: never) it says its kernel
// timing was cut, as a GPU's planning budget runs out.
class CachingCpu final : public cpu::CpuBackend {
 public:
  CachingCpu() : cpu::CpuBackend(BackendOptions{1, false}) {}
  KernelCache* kernel_cache() override { return &cache; }
  bool kernel_timing_cut() const override { return cut_after >= 0 && fused_forwards >= cut_after; }
  KernelCache cache{"", "cpu test"};
  int fused_forwards = 0;
  int cut_after = -1;

 protected:
  Tensor conv2d_forward_bn_stats_impl(const Tensor& x, const Tensor& w, const ConvParams& p,
                                      const BnApply* pro, float eps, BnSaved* stats) override {
    ++fused_forwards;
    return cpu::CpuBackend::conv2d_forward_bn_stats_impl(x, w, p, pro, eps, stats);
  }
};

Tensor resnet20_batch(Backend& be) {
  return be.upload_images(make_tensor(normals(8 * 12 * 12, 90), {8, 1, 12, 12}, Layout::nhwc));
}

// A file of this process's own in the temporary folder (tests of one binary run side by side
// under ctest -j).
std::string temp_file(const std::string& name) {
  const std::string f = ::testing::TempDir() + std::to_string(::getpid()) + "-" + name;
  std::remove(f.c_str());
  return f;
}

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

struct WrongOp {
  const char* op;      // the op planted wrong
  const char* tensor;  // what the warning names as differing
};
class FusionAutoWrongOp : public ::testing::TestWithParam<WrongOp> {};

// A planted wrong fused kernel (forward, or backward): the check of the first chain's timing
// runs finds it, and every chain runs apart for the whole run, with one warning naming the
// chain, the tensor and the difference, recorded in the fast paths' verdicts (their file too,
// so a restart on this device does not try again). The model is left as it was.
TEST_P(FusionAutoWrongOp, TurnsEveryChainOffWithOneWarningAndIsRecorded) {
  auto be = plant_wrong_ops(cpu_backend(1));
  const auto model = auto_fused_resnet(*be, "resnet20", 1, 7);
  Model& m = *model;
  const Floats p0 = host_floats(*be, m.flat_params()), b0 = host_floats(*be, m.flat_buffers());
  const std::string file = temp_file("fusion-wrong-op-fast-paths.json");
  FastPathChecks checks(file, "cpu test");
  Tensor x = resnet20_batch(*be);
  std::vector<FusionVerdict> v;
  testing::internal::CaptureStdout();
  {
    PlantWrongOp plant(GetParam().op);
    v = choose_fusion(m, x, &checks);
  }
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(v.empty());
  for (const FusionChain& c : fusion_chains(m.net())) EXPECT_FALSE(c.fused()) << c.name();
  ASSERT_TRUE(checks.off(kFastPathFusion));
  const std::string why = checks.why_off(kFastPathFusion);
  EXPECT_NE(why.find("layer1.0.conv1+bn1+conv2"), std::string::npos) << why;
  EXPECT_NE(why.find(GetParam().tensor), std::string::npos) << why;
  EXPECT_NE(why.find("normalized difference of 1.00e+00"), std::string::npos) << why;
  EXPECT_EQ(count_of(out, "warning:"), 1) << out;
  EXPECT_NE(out.find(why), std::string::npos) << out;
  EXPECT_EQ(out.find("--fusion auto: 0 of"), std::string::npos) << "no summary: " << out;
  EXPECT_TRUE(bitwise_equal(host_floats(*be, m.flat_params()), p0)) << "weights changed";
  EXPECT_TRUE(bitwise_equal(host_floats(*be, m.flat_buffers()), b0)) << "running statistics changed";
  FastPathChecks restarted(file, "cpu test");
  EXPECT_TRUE(restarted.off(kFastPathFusion));
  std::remove(file.c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Ops, FusionAutoWrongOp,
    ::testing::Values(WrongOp{"bn_relu+conv2d_forward+stats", "the output of layer1.0.conv2"},
                      WrongOp{"conv2d_backward+bn_relu", "the input gradient of layer1.0.bn1"}),
    [](const ::testing::TestParamInfo<WrongOp>& i) {
      return std::string(i.index == 0 ? "forward" : "backward");
    });

// Where the fast paths' verdicts say fusion is off on this device (a check failed in a run
// before), nothing is run fused, timed or checked: every chain runs apart, and one line says why.
TEST(FusionAuto, AFailedCheckKeptFromBeforeSkipsTheTiming) {
  const std::string file = temp_file("fusion-off-fast-paths.json");
  testing::internal::CaptureStdout();
  FastPathChecks(file, "cpu test").failed(kFastPathFusion, "an earlier difference");
  testing::internal::GetCapturedStdout();
  FastPathChecks checks(file, "cpu test");
  ASSERT_TRUE(checks.off(kFastPathFusion));
  CachingCpu be;
  const auto model = auto_fused_resnet(be, "resnet20", 1, 7);
  testing::internal::CaptureStdout();
  const std::vector<FusionVerdict> v = choose_fusion(*model, resnet20_batch(be), &checks);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(be.fused_forwards, 0) << "a chain ran fused";
  EXPECT_FALSE(checks.checked(kFastPathFusion)) << "checked again";
  EXPECT_EQ(be.cache.unsaved(), 0u);
  for (const FusionChain& c : fusion_chains(model->net())) EXPECT_FALSE(c.fused()) << c.name();
  EXPECT_EQ(count_of(out, "\n"), 1) << "one line: " << out;
  EXPECT_NE(out.find("--fusion auto: every chain runs apart, untimed"), std::string::npos) << out;
  EXPECT_NE(out.find("an earlier difference"), std::string::npos) << out;
  std::remove(file.c_str());
}

// The verdicts go to the backend's kernel cache, one per chain shape; a model meeting the same
// shapes (a restart) takes them from there untimed, and still checks each shape's fused run
// against its run apart, once.
TEST(FusionAuto, VerdictsAreKeptInTheKernelCacheAndTakenFromItUntimed) {
  CachingCpu be;
  const auto first = auto_fused_resnet(be, "resnet20", 1, 7);
  const std::vector<FusionVerdict> timed = choose_fusion(*first, resnet20_batch(be));
  ASSERT_EQ(timed.size(), 9u);
  // resnet20's chain shapes: layer1's blocks, layer2.0, layer2's other two, layer3.0, the rest.
  EXPECT_EQ(be.cache.unsaved(), 5u);
  // Timed: once to warm up and three times per shape; a basic chain runs two fused forward ops.
  EXPECT_EQ(be.fused_forwards, 5 * 4 * 2);
  for (const FusionVerdict& f : timed) EXPECT_FALSE(f.cached) << f.chain;

  be.fused_forwards = 0;
  const auto again = auto_fused_resnet(be, "resnet20", 1, 8);
  FastPathChecks checks("", "cpu test");
  const std::vector<FusionVerdict> cached = choose_fusion(*again, resnet20_batch(be), &checks);
  ASSERT_EQ(cached.size(), timed.size());
  EXPECT_EQ(be.fused_forwards, 5 * 1 * 2) << "timed again";
  EXPECT_TRUE(checks.checked(kFastPathFusion));
  EXPECT_FALSE(checks.off(kFastPathFusion));
  std::vector<FusionChain> chains = fusion_chains(again->net());
  for (size_t i = 0; i < cached.size(); ++i) {
    EXPECT_TRUE(cached[i].cached) << cached[i].chain;
    EXPECT_EQ(cached[i].chain, timed[i].chain);
    EXPECT_EQ(cached[i].fused, timed[i].fused) << cached[i].chain;
    EXPECT_EQ(cached[i].fused_ms, timed[i].fused_ms) << cached[i].chain;
    EXPECT_EQ(cached[i].apart_ms, timed[i].apart_ms) << cached[i].chain;
    EXPECT_EQ(chains[i].fused(), cached[i].fused) << chains[i].name();
  }
  EXPECT_NE(fusion_summary(cached).find("9 as the kernel cache had them, untimed"), std::string::npos)
      << fusion_summary(cached);
}

// Chains timed once the backend's kernel timing was cut (a GPU's fused graphs planned past
// its planning budget, their first engine untimed) are provisional: taken in this run, not
// kept in the kernel cache, so a restart (which times those kernels) times them again instead
// of taking a verdict measured on untimed kernels for good. Those timed before the cut are kept.
TEST(FusionAuto, VerdictsTimedPastTheKernelTimingBudgetAreNotKept) {
  CachingCpu be;
  be.cut_after = 5;  // inside the first shape's timing: no verdict is kept
  const auto first = auto_fused_resnet(be, "resnet20", 1, 7);
  const std::vector<FusionVerdict> timed = choose_fusion(*first, resnet20_batch(be));
  ASSERT_EQ(timed.size(), 9u);
  EXPECT_EQ(be.fused_forwards, 5 * 4 * 2) << "every shape timed";
  EXPECT_EQ(be.cache.unsaved(), 0u) << "the first shape was timed across the cut";
  int provisional = 0;
  for (const FusionVerdict& f : timed) provisional += f.provisional;
  EXPECT_EQ(provisional, 9);
  EXPECT_NE(fusion_summary(timed).find("9 timed on fused graphs planned past the planning budget"),
            std::string::npos)
      << fusion_summary(timed);

  be.fused_forwards = 0;
  be.cut_after = 4 * 2 + 1;  // after the first shape's timing
  const auto second = auto_fused_resnet(be, "resnet20", 1, 8);
  const std::vector<FusionVerdict> again = choose_fusion(*second, resnet20_batch(be));
  ASSERT_EQ(again.size(), 9u);
  EXPECT_EQ(be.cache.unsaved(), 1u) << "only the shape timed before the cut is kept";
  for (size_t i = 0; i < 3; ++i) EXPECT_FALSE(again[i].provisional) << again[i].chain;
  for (size_t i = 3; i < again.size(); ++i) EXPECT_TRUE(again[i].provisional) << again[i].chain;

  // A restart with no cut: the kept shape from the cache, untimed; the others timed again.
  be.fused_forwards = 0;
  be.cut_after = -1;
  const auto third = auto_fused_resnet(be, "resnet20", 1, 9);
  const std::vector<FusionVerdict> restarted = choose_fusion(*third, resnet20_batch(be));
  ASSERT_EQ(restarted.size(), 9u);
  EXPECT_EQ(be.fused_forwards, (1 * 1 + 4 * 4) * 2) << "one shape from the cache, four timed";
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(restarted[i].cached) << restarted[i].chain;
  for (size_t i = 3; i < restarted.size(); ++i) {
    EXPECT_FALSE(restarted[i].cached) << restarted[i].chain;
    EXPECT_FALSE(restarted[i].provisional) << restarted[i].chain;
  }
  EXPECT_EQ(be.cache.unsaved(), 5u);
}

// Rank 1 of two, as its collectives see it: rank 0's on/off list arrives by broadcast, and the
// all-gather says whether rank 0 can fuse.
class SecondOfTwoRanks final : public Communicator {
 public:
  std::vector<uint8_t> rank0_on;  // what rank 0 broadcasts
  bool rank0_cannot = false;
  int rank() const override { return 1; }
  int size() const override { return 2; }
  int local_rank() const override { return 1; }
  std::string name() const override { return "two ranks (test)"; }
  void allreduce_sum(void*, int64_t, DType) override { ADD_FAILURE() << "no all-reduce expected"; }
  void broadcast(void* data, size_t bytes, int root) override {
    EXPECT_EQ(root, 0);
    ASSERT_EQ(bytes, rank0_on.size());
    std::memcpy(data, rank0_on.data(), bytes);
  }
  void barrier() override {}
  std::vector<uint64_t> allgather(uint64_t value) override { return {rank0_cannot ? 1u : 0u, value}; }
  [[noreturn]] void abort(int) override { std::abort(); }
};

// Several ranks: every rank runs rank 0's verdicts, whatever its own timing said (the same
// computation and memory on every rank), and where any rank cannot fuse (its check failed or
// was off), every rank runs every chain apart.
TEST(FusionAuto, EveryRankRunsRankZerosVerdicts) {
  auto be = cpu_backend(1);
  SecondOfTwoRanks comm;
  CommWorker worker(comm, 60);
  comm.rank0_on.assign(9, 0);
  for (size_t i = 0; i < 9; i += 3) comm.rank0_on[i] = 1;
  const auto model = auto_fused_resnet(*be, "resnet20", 1, 7);
  const std::vector<FusionVerdict> v = choose_fusion(*model, resnet20_batch(*be), nullptr, &worker);
  ASSERT_EQ(v.size(), 9u);
  std::vector<FusionChain> chains = fusion_chains(model->net());
  for (size_t i = 0; i < 9; ++i) {
    EXPECT_EQ(v[i].fused, comm.rank0_on[i] != 0) << v[i].chain;
    EXPECT_EQ(chains[i].fused(), comm.rank0_on[i] != 0) << chains[i].name();
  }

  comm.rank0_cannot = true;
  comm.rank0_on.assign(9, 1);
  const auto other = auto_fused_resnet(*be, "resnet20", 1, 7);
  testing::internal::CaptureStdout();
  const std::vector<FusionVerdict> none = choose_fusion(*other, resnet20_batch(*be), nullptr, &worker);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(none.empty());
  for (const FusionChain& c : fusion_chains(other->net())) EXPECT_FALSE(c.fused()) << c.name();
  EXPECT_NE(out.find("every chain runs apart: rank 0 cannot run them fused"), std::string::npos) << out;
}

// A bottleneck's two links share conv2 and make one chain, decided together: switched on,
// conv2 both applies bn1 and makes bn2's statistics. ResNet-50's 16 blocks give 16 chains,
// each timed (once per shape) with a verdict.
TEST(FusionAuto, ABottlenecksTwoLinksAreOneChain) {
  auto be = cpu_backend(2);
  const auto model = auto_fused_resnet(*be, "resnet50", 3, 3);
  Model& m = *model;
  std::vector<FusionChain> chains = fusion_chains(m.net());
  ASSERT_EQ(chains.size(), 16u);
  EXPECT_EQ(chains[0].name(), "layer1.0.conv1+bn1+conv2+bn2+conv3");
  Conv2d* conv2 = nullptr;
  m.net().visit([&](Layer& l) {
    if (l.name() == "layer1.0.conv2") conv2 = dynamic_cast<Conv2d*>(&l);
  });
  ASSERT_NE(conv2, nullptr);
  chains[0].set_fused(false);
  EXPECT_FALSE(conv2->makes_bn_statistics());
  chains[0].set_fused(true);
  EXPECT_TRUE(conv2->makes_bn_statistics());
  EXPECT_TRUE(chains[0].fused());

  Tensor x = be->upload_images(make_tensor(normals(2 * 3 * 32 * 32, 91), {2, 3, 32, 32}, Layout::nhwc));
  const std::vector<FusionVerdict> v = choose_fusion(m, x);
  ASSERT_EQ(v.size(), 16u);
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v[i].chain, chains[i].name());
    EXPECT_EQ(chains[i].fused(), v[i].fused) << v[i].chain;
    EXPECT_GT(v[i].apart_ms, 0.0) << v[i].chain;
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, Checkpointing, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "_threads";
                         });

}  // namespace

// Model::initialize draws each parameter from its own stream in chunks, in parallel: the
// weights are the same whatever the thread count, and the same as drawing each parameter's
// stream from its start in one go (as runs and checkpoints made before the chunks had them).
TEST(ModelInit, TheWeightsDoNotDependOnTheThreadCount) {
  ResNetOptions o;
  o.arch = "resnet50";  // 3x3 convolutions of 590k weights: many chunks of 64k each
  o.num_classes = 10;
  const uint64_t seed = 77;
  auto draw = [&](int threads) {
    auto be = cpu_backend(threads);
    Model m(build_resnet(o), *be);
    m.initialize(seed);
    std::vector<Floats> w;
    for (auto* p : m.params()) w.push_back(host_floats(*be, p->value));
    return w;
  };
  const std::vector<Floats> one = draw(1), four = draw(4);
  auto be = cpu_backend(1);
  Model m(build_resnet(o), *be);
  ASSERT_EQ(one.size(), m.params().size());
  int64_t compared = 0;
  for (size_t i = 0; i < m.params().size(); ++i) {
    const Param* p = m.params()[i];
    Philox rng(seed, uint32_t(i), 0x1417u);
    std::vector<float> ref(size_t(p->value.numel()));
    for (float& v : ref) {
      switch (p->init) {
        case Param::Init::kaiming_fan_out: v = rng.normal() * std::sqrt(2.f / float(p->fan)); break;
        case Param::Init::uniform_fan_in: v = (2.f * rng.uniform() - 1.f) * (1.f / std::sqrt(float(p->fan))); break;
        case Param::Init::ones: v = 1.f; break;
        case Param::Init::zeros: v = 0.f; break;
      }
    }
    ASSERT_EQ(one[i].size(), ref.size()) << p->name;
    EXPECT_EQ(std::memcmp(one[i].data(), ref.data(), ref.size() * 4), 0) << p->name << ": one thread";
    EXPECT_EQ(std::memcmp(four[i].data(), ref.data(), ref.size() * 4), 0) << p->name << ": four threads";
    compared += int64_t(ref.size());
  }
  EXPECT_EQ(compared, m.num_params());
}
