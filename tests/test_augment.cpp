// The recipe aids: random erasing against torchvision's RandomErasing (the same draws give the
// same box, checked by torchvision itself), mixup/cutmix pair mixing and its label mixing in the
// loss, the Beta draws, determinism of augmented batches across loader threads and rank counts,
// the weights' moving average against a hand computation, --lr-per-256, an exact resume with
// every aid on (moving average included), and every recipe file parsing and starting.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoints/checkpoint.h"
#include "core/philox.h"
#include "engine/ema.h"
#include "engine/model.h"
#include "io/augment.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "kernels/ops.h"
#include "fmnist_resnet.h"
#include "layers/resnet.h"
#include "run_command.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace spotrain;

namespace {

const std::string kBin = SPOTRAIN_BIN;

std::string fresh_dir(const std::string& name) {
  const std::string d = (fs::temp_directory_path() / ("spotrain_aug_" + name + "_" + std::to_string(getpid()))).string();
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Philox draws, each recorded as torchvision would ask for it.
struct RecordingDraws : io::ErasingDraws {
  explicit RecordingDraws(uint64_t seed) : rng(seed, 3) {}
  float uniform(float lo, float hi) override {
    const float v = lo + (hi - lo) * rng.uniform();
    events.push_back({{"kind", "uniform"}, {"lo", lo}, {"hi", hi}, {"value", v}});
    return v;
  }
  int below(int n) override {
    const int v = int(rng.below(uint32_t(n)));
    events.push_back({{"kind", "randint"}, {"n", n}, {"value", v}});
    return v;
  }
  Philox rng;
  json events = json::array();
};

}  // namespace

TEST(RandomErasing, TheSameDrawsGiveTorchvisionsBox) {
  if (run_command("/usr/bin/python3 -c 'import torch, torchvision'").code != 0)
    GTEST_SKIP() << "python3 with torch and torchvision is not installed (scripts/install-deps.sh --test)";
  const std::string dir = fresh_dir("erasing");
  json cases = json::array();
  int erased = 0, kept = 0;
  const int sizes[][2] = {{28, 28}, {32, 32}, {7, 19}, {224, 160}, {3, 3}};
  for (int k = 0; k < 300; ++k) {
    io::ErasingOptions o;
    o.p = k % 3 == 0 ? 1.f : 0.5f;
    if (k % 5 == 4) {  // large boxes: some tries fail and the loop retries or gives up
      o.scale_min = 0.4f;
      o.scale_max = 0.98f;
    }
    const int h = sizes[k % 5][0], w = sizes[k % 5][1];
    RecordingDraws d{uint64_t(k)};
    io::EraseBox b = io::erasing_box(o, h, w, d);
    (b.erase ? erased : kept) += 1;
    cases.push_back({{"h", h}, {"w", w}, {"p", o.p}, {"scale", {o.scale_min, o.scale_max}},
                     {"ratio", {o.ratio_min, o.ratio_max}}, {"events", d.events},
                     {"box", b.erase ? json{b.top, b.left, b.h, b.w} : json(nullptr)}});
  }
  EXPECT_GT(erased, 50);
  EXPECT_GT(kept, 20);
  std::ofstream(dir + "/cases.json") << cases.dump();
  auto r = run_command("/usr/bin/python3 " + std::string(SPOTRAIN_SOURCE_DIR) + "/tests/check_random_erasing.py " +
                       dir + "/cases.json");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("300 cases agree"), std::string::npos) << r.out;
}

TEST(RandomErasing, ErasesTheBoxToTheMeanAndDrawsDependOnTheSampleOnly) {
  io::ErasingOptions o;
  o.p = 1;
  const io::EraseBox a = io::draw_erasing(o, 28, 28, 5, 2, 1234);
  const io::EraseBox b = io::draw_erasing(o, 28, 28, 5, 2, 1234);
  EXPECT_EQ(a.erase, b.erase);
  EXPECT_EQ(a.top, b.top);
  EXPECT_EQ(a.left, b.left);
  EXPECT_EQ(a.h, b.h);
  EXPECT_EQ(a.w, b.w);
  ASSERT_TRUE(a.erase);
  // Other samples and another epoch draw other boxes (the draw depends on them).
  auto same = [](const io::EraseBox& x, const io::EraseBox& y) {
    return x.erase == y.erase && x.top == y.top && x.left == y.left && x.h == y.h && x.w == y.w;
  };
  int same_sample = 0, same_epoch = 0;
  for (int64_t id = 0; id < 200; ++id) {
    same_sample += same(io::draw_erasing(o, 28, 28, 5, 2, id), io::draw_erasing(o, 28, 28, 5, 2, id + 1));
    same_epoch += same(io::draw_erasing(o, 28, 28, 5, 2, id), io::draw_erasing(o, 28, 28, 5, 3, id));
  }
  EXPECT_LT(same_sample, 20) << "boxes hardly depend on the sample";
  EXPECT_LT(same_epoch, 20) << "boxes hardly depend on the epoch";
  std::vector<float> img(28 * 28 * 3, 1.f);
  io::apply_erasing(img.data(), 28, 28, 3, a);
  int zeros = 0;
  for (int y = 0; y < 28; ++y)
    for (int x = 0; x < 28; ++x) {
      const bool inside = y >= a.top && y < a.top + a.h && x >= a.left && x < a.left + a.w;
      for (int c = 0; c < 3; ++c) {
        EXPECT_EQ(img[size_t((y * 28 + x) * 3 + c)], inside ? 0.f : 1.f);
        zeros += inside;
      }
    }
  EXPECT_EQ(zeros, a.h * a.w * 3);
  const double area = double(a.h * a.w) / (28.0 * 28.0);
  EXPECT_GT(area, 0.01);
  EXPECT_LT(area, 0.40);
}

TEST(Mixing, MixupAndCutmixMixBothImagesOfAPair) {
  const int h = 8, w = 6, c = 2, n = h * w * c;
  std::vector<float> a(n), b(n);
  for (int i = 0; i < n; ++i) {
    a[size_t(i)] = float(i);
    b[size_t(i)] = float(-i - 1);
  }
  io::PairMix mix;
  mix.lambda = 0.3;
  auto a2 = a, b2 = b;
  io::apply_pair_mix(a2.data(), b2.data(), h, w, c, mix);
  for (int i = 0; i < n; ++i) {
    EXPECT_FLOAT_EQ(a2[size_t(i)], 0.3f * a[size_t(i)] + 0.7f * b[size_t(i)]);
    EXPECT_FLOAT_EQ(b2[size_t(i)], 0.3f * b[size_t(i)] + 0.7f * a[size_t(i)]);
  }
  io::MixOptions o;
  o.cutmix_alpha = 1.0f;
  int boxes = 0;
  for (int64_t id = 0; id < 200; ++id) {
    io::PairMix m = io::draw_pair_mix(o, h, w, 9, 0, id);
    ASSERT_TRUE(m.cutmix);
    EXPECT_NEAR(m.lambda, 1.0 - double(m.h * m.w) / double(h * w), 1e-12) << "lambda is the box's real area";
    a2 = a;
    b2 = b;
    io::apply_pair_mix(a2.data(), b2.data(), h, w, c, m);
    boxes += m.h * m.w > 0;
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int k = 0; k < c; ++k) {
          const size_t i = size_t((y * w + x) * c + k);
          const bool in = y >= m.top && y < m.top + m.h && x >= m.left && x < m.left + m.w;
          ASSERT_EQ(a2[i], in ? b[i] : a[i]);
          ASSERT_EQ(b2[i], in ? a[i] : b[i]);
        }
  }
  EXPECT_GT(boxes, 150);
  // Both on: the switch probability picks cutmix for about that share of pairs.
  o.mixup_alpha = 0.2f;
  o.switch_prob = 0.25f;
  int cut = 0;
  for (int64_t id = 0; id < 2000; ++id) cut += io::draw_pair_mix(o, h, w, 9, 0, id).cutmix;
  EXPECT_NEAR(cut / 2000.0, 0.25, 0.04);
}

TEST(Mixing, BetaDrawsHaveTheBetaMoments) {
  for (double alpha : {0.2, 1.0, 2.0}) {
    double s = 0, s2 = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) {
      const double x = io::sample_beta(alpha, 3, uint64_t(i));
      ASSERT_GE(x, 0.0);
      ASSERT_LE(x, 1.0);
      s += x;
      s2 += x * x;
    }
    const double mean = s / n, var = s2 / n - mean * mean;
    EXPECT_NEAR(mean, 0.5, 0.01) << alpha;
    EXPECT_NEAR(var, 1.0 / (4.0 * (2.0 * alpha + 1.0)), 0.01) << alpha;  // Beta(a, a) variance
  }
}

TEST(Mixing, TheLossMixesTheTwoLabelsLossesAndGradients) {
  auto be = make_backend("cpu", BackendOptions{1, true});
  const int64_t n = 4, m = 5;
  Tensor z = Tensor::host({n, m});
  Philox rng(1, 2);
  for (int64_t i = 0; i < n * m; ++i) z.data<float>()[i] = rng.normal();
  const std::vector<int32_t> ya = {0, 1, 2, 3}, yb = {4, 1, 0, 2};
  const std::vector<float> lam = {0.3f, 1.0f, 0.75f, 0.5f};
  for (float smoothing : {0.f, 0.1f}) {
    Tensor da, db, dm;
    LabelMix mix{yb.data(), lam.data()};
    LossResult mixed = be->softmax_xent(z, ya.data(), smoothing, 2.f, &dm, &mix);
    for (int64_t i = 0; i < n; ++i) {  // row by row against the two plain losses
      Tensor row = Tensor::view(z, i * m, {1, m});
      Tensor dra, drb;
      LossResult la = be->softmax_xent(row, &ya[size_t(i)], smoothing, 2.f, &dra);
      LossResult lb = be->softmax_xent(row, &yb[size_t(i)], smoothing, 2.f, &drb);
      for (int64_t j = 0; j < m; ++j)
        EXPECT_NEAR(dm.data<float>()[i * m + j] * float(n),
                    lam[size_t(i)] * dra.data<float>()[j] + (1 - lam[size_t(i)]) * drb.data<float>()[j], 1e-5);
      (void)la;
      (void)lb;
    }
    double want = 0;
    for (int64_t i = 0; i < n; ++i) {
      Tensor row = Tensor::view(z, i * m, {1, m});
      want += lam[size_t(i)] * be->softmax_xent(row, &ya[size_t(i)], smoothing, 1.f, nullptr).loss +
              (1 - lam[size_t(i)]) * be->softmax_xent(row, &yb[size_t(i)], smoothing, 1.f, nullptr).loss;
    }
    EXPECT_NEAR(mixed.loss, want / double(n), 1e-9);
    LossResult plain = be->softmax_xent(z, ya.data(), smoothing, 1.f, nullptr);
    EXPECT_EQ(mixed.top1, plain.top1) << "accuracy counts each sample's own label";
  }
}

// Every augmentation on: the batches a 1-rank, 1-thread loader makes equal, sample for
// sample, those of 2 ranks with 3 threads each.
TEST(Mixing, AugmentedBatchesDoNotDependOnThreadsOrRanks) {
  std::shared_ptr<const io::Dataset> data =
      io::take_first(io::load_idx_dataset(io::kDefaultFashionMnistDir, "train"), 256);
  auto make = [&](int rank, int world, int workers) {
    io::LoaderOptions lo;
    lo.batch_size = 16 / world;
    lo.rank = rank;
    lo.world = world;
    lo.seed = 42;
    lo.workers = workers;
    lo.transforms = io::fashion_mnist_transforms(true);
    lo.erasing.p = 0.5f;
    lo.mix.mixup_alpha = 0.2f;
    lo.mix.cutmix_alpha = 1.0f;
    return std::make_unique<io::Loader>(data, lo);
  };
  auto one = make(0, 1, 1);
  auto r0 = make(0, 2, 3), r1 = make(1, 2, 3);
  for (int64_t epoch : {0, 3}) {
    one->start_epoch(epoch);
    r0->start_epoch(epoch);
    r1->start_epoch(epoch);
    io::Batch b, c0, c1;
    int batches = 0;
    while (one->next(b)) {
      ASSERT_TRUE(r0->next(c0));
      ASSERT_TRUE(r1->next(c1));
      ASSERT_EQ(b.lam.size(), 16u);
      const int64_t per = b.images.numel() / 16;
      for (int i = 0; i < 16; ++i) {
        const io::Batch& c = i < 8 ? c0 : c1;
        const int k = i % 8;
        ASSERT_EQ(b.labels[size_t(i)], c.labels[size_t(k)]);
        ASSERT_EQ(b.labels_b[size_t(i)], c.labels_b[size_t(k)]);
        ASSERT_EQ(b.lam[size_t(i)], c.lam[size_t(k)]);
        ASSERT_EQ(0, std::memcmp(b.images.data<float>() + i * per, c.images.data<float>() + k * per,
                                 size_t(per) * 4))
            << "epoch " << epoch << " sample " << i;
      }
      ++batches;
    }
    EXPECT_EQ(batches, 16);
  }
}

TEST(WeightEma, FollowsTheHandComputationAndSwapsBack) {
  auto be = make_backend("cpu", BackendOptions{1, true});
  Model m(build_resnet(fmnist_resnet20()), *be);
  m.initialize(3);
  const double decay = 0.75;
  WeightEma ema(m, decay);
  const int64_t n = m.num_params();
  std::vector<float> shadow(m.flat_params().data<float>(), m.flat_params().data<float>() + n);
  std::vector<float> bn(m.buffers()[0]->value.data<float>(),
                        m.buffers()[0]->value.data<float>() + m.buffers()[0]->value.numel());
  for (int step = 0; step < 3; ++step) {  // move the weights and a BN statistic, then average
    float* p = m.flat_params().data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] += 0.01f * float((i + step) % 7);
    m.flat_params().mark_written();
    float* rm = m.buffers()[0]->value.data<float>();
    rm[0] += 1.f;
    ema.update();
    for (int64_t i = 0; i < n; ++i) shadow[size_t(i)] = float(decay) * shadow[size_t(i)] + float(1 - decay) * p[i];
    bn[0] = float(decay) * bn[0] + float(1 - decay) * rm[0];
  }
  for (int64_t i = 0; i < n; i += 97) ASSERT_NEAR(ema.params().data<float>()[i], shadow[size_t(i)], 1e-6);
  EXPECT_NEAR(ema.buffers()[0].data<float>()[0], bn[0], 1e-6);
  const std::vector<float> own(m.flat_params().data<float>(), m.flat_params().data<float>() + n);
  {
    EmaSwap with_average(&ema);
    EXPECT_NEAR(m.flat_params().data<float>()[5], shadow[5], 1e-6);
  }
  EXPECT_EQ(0, std::memcmp(m.flat_params().data<float>(), own.data(), size_t(n) * 4)) << "swapped back";
}

TEST(Recipes, LrPer256ScalesWithTheGlobalBatch) {
  const std::string dir = fresh_dir("lr256");
  auto r = run_command(kBin + " train --data synthetic --model resnet20 --image-size 32 --steps 2 --batch-size 32 "
                              "--lr-per-256 0.4 --threads 2 --log-every 1 --ckpt-dir " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("learning rate 0.05000 = --lr-per-256 0.4 x global batch 32 / 256"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lr 0.05000"), std::string::npos) << r.out;
  auto odd = run_command(kBin + " train --data synthetic --steps 1 --batch-size 7 --mixup 0.2 --ckpt-dir " + dir + "/x");
  EXPECT_EQ(odd.code, 1);
  EXPECT_NE(odd.out.find("--batch-size must be even"), std::string::npos) << odd.out;
}

// Every aid on, stopped by a signal mid-epoch and resumed: the final weights, momentum and
// moving average equal an uninterrupted run's bit for bit.
TEST(Recipes, AResumeWithEveryAidOnIsExact) {
  const std::string dir = fresh_dir("resume");
  const std::string args = " train --data fashion-mnist --train-limit 512 --test-limit 128 --model resnet20 "
                           "--batch-size 32 --epochs 2 --threads 2 --log-every 4 --random-erasing 0.5 "
                           "--mixup 0.2 --cutmix 1.0 --ema-decay 0.9 --lr-per-256 0.8 --label-smoothing 0.1 ";
  auto a = run_command(kBin + args + "--ckpt-dir " + dir + "/straight");
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_NE(a.out.find("EMA top-1"), std::string::npos) << a.out;
  auto b = run_command("SPOTRAIN_FAULT=term:0:21 " + kBin + args + "--ckpt-dir " + dir + "/resumed");
  ASSERT_EQ(b.code, 75) << b.out;
  auto c = run_command(kBin + args + "--ckpt-dir " + dir + "/resumed --resume auto");
  ASSERT_EQ(c.code, 0) << c.out;
  const std::string f1 = dir + "/straight/ckpt-00000032.h5", f2 = dir + "/resumed/ckpt-00000032.h5";
  ASSERT_TRUE(fs::exists(f1) && fs::exists(f2));
  EXPECT_TRUE(checkpoint_has_group(f1, "ema"));
  auto d = run_command("h5diff " + f1 + " " + f2 + " /model /model && h5diff " + f1 + " " + f2 +
                       " /ema /ema && h5diff " + f1 + " " + f2 + " /optimizer/momentum /optimizer/momentum");
  EXPECT_EQ(d.code, 0) << d.out;
  // The two runs' final evaluations agree, and eval --ema reads the average back.
  auto e = run_command(kBin + " eval --ckpt " + f1 + " --ema --test-limit 128 --json " + dir + "/e.json");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(json::parse(std::ifstream(dir + "/e.json"))["weights"], "ema");
}

TEST(Recipes, EveryRecipeFileParsesAndStarts) {
  int recipes = 0;
  for (const auto& e : fs::recursive_directory_iterator(std::string(SPOTRAIN_SOURCE_DIR) + "/examples")) {
    if (e.path().extension() != ".toml") continue;
    {  // a catalog of offers for `spotrain plan` (examples/offers.toml) is not a recipe: test_plan and
       // test_doc_commands plan it
      std::ifstream f(e.path());
      bool catalog = false;
      for (std::string line; !catalog && std::getline(f, line);) catalog = line == "[[offer]]";
      if (catalog) continue;
    }
    ++recipes;
    const std::string dir = fresh_dir("recipe_" + e.path().stem().string());
    // The recipe's own settings, with the data, size and length of a smoke test on top.
    auto r = run_command(kBin + " train --config " + e.path().string() +
                         " --data synthetic --image-size 32 --batch-size 4 --steps 2 --train-limit 64 "
                         "--test-limit 16 --threads 2 --workers 1 --device cpu --log-every 1 --ckpt-dir " + dir);
    EXPECT_EQ(r.code, 0) << e.path() << "\n" << r.out;
    EXPECT_NE(r.out.find("step 2/2"), std::string::npos) << e.path() << "\n" << r.out;
  }
  EXPECT_GE(recipes, 3);
}
