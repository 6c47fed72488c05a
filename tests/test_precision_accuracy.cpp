// Mixed precision must not cost accuracy: ResNet-20 on Fashion-MNIST trained with the same
// recipe and seed in fp32, bf16 and fp16 (loss-scaled) reaches the same test top-1 within
// two points on the full 10000-image test set. Slow: three short trainings.
// Caveat, measured: at this size the final accuracy is chaotic in the rounding. Over seeds
// 0..7, |bf16 - fp32| ranged 0.09..1.48 points and |fp16 - fp32| 0.13..1.63 (means +0.03
// and -0.34), and fp32 alone moved by up to 1.74 points from 2 threads to 1; the band is set
// just above that spread. The seed and thread count are pinned so the run is reproducible.
// Seed 0 was within 0.5 for both with AVX-512 (nChw16c), and gave +1.22 (bf16) and +0.60
// (fp16) on an AVX2 processor (nChw8c, bf16 computed in fp32 there: other reduction orders).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "run/trainer.h"

using namespace spotrain;

namespace {

bool have_fmnist() {
  return std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
}

struct Outcome {
  TrainResult result;
  double seconds = 0;
};

Outcome train(const std::string& precision) {
  RunConfig cfg;
  cfg.model = "resnet20";
  cfg.data = "fashion-mnist";
  cfg.train_limit = 12288;
  cfg.test_limit = 0;  // all 10000 test images
  cfg.epochs = 2;
  cfg.batch_size = 128;
  cfg.lr = 0.1f;
  cfg.precision = precision;
  cfg.seed = 0;
  cfg.threads = 2;  // reduction order changes with the thread count, and with it the result
  cfg.device = "cpu";
  cfg.ckpt_dir = "";
  cfg.eval_each_epoch = false;
  cfg.log_every = 1000;
  auto t0 = std::chrono::steady_clock::now();
  Outcome o;
  o.result = Trainer(cfg).run();
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ %s ] test top-1 %.4f, loss %.4f, skipped %lld, scale %g, %.1f s\n",
              precision.c_str(), o.result.test.top1, o.result.test.loss,
              static_cast<long long>(o.result.skipped_steps), o.result.loss_scale, o.seconds);
  return o;
}

}  // namespace

TEST(PrecisionAccuracy, Bf16AndFp16MatchFp32OnFashionMnist) {
  if (!have_fmnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  Outcome f32 = train("fp32"), bf16 = train("bf16"), f16 = train("fp16");
  for (const Outcome* o : {&f32, &bf16, &f16}) {
    EXPECT_EQ(o->result.test.samples, 10000);
    EXPECT_GT(o->result.test.top1, 0.75) << "a run did not learn";
  }
  EXPECT_EQ(f32.result.steps, 2 * (12288 / 128));
  EXPECT_EQ(f16.result.steps, f32.result.steps);
  EXPECT_LE(std::fabs(bf16.result.test.top1 - f32.result.test.top1), 0.02)
      << "bf16 " << bf16.result.test.top1 << " vs fp32 " << f32.result.test.top1;
  EXPECT_LE(std::fabs(f16.result.test.top1 - f32.result.test.top1), 0.02)
      << "fp16 " << f16.result.test.top1 << " vs fp32 " << f32.result.test.top1;
  RecordProperty("fp32_top1", std::to_string(f32.result.test.top1));
  RecordProperty("bf16_top1", std::to_string(bf16.result.test.top1));
  RecordProperty("fp16_top1", std::to_string(f16.result.test.top1));
  RecordProperty("seconds", std::to_string(f32.seconds + bf16.seconds + f16.seconds));
}
