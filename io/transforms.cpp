// Image transforms (see transforms.h): random zero-padded crop and flip drawn per sample from
// Philox, then per-channel normalization into the fp32 NHWC batch row.
#include "io/transforms.h"

#include "core/error.h"
#include "core/philox.h"

namespace spotrain {
namespace io {

void check_transform_options(const TransformOptions& opt, ImageShape shape) {
  auto ok_size = [&](size_t n) { return n == 0 || n == 1 || n == size_t(shape.c); };
  SPOTRAIN_CHECK(ok_size(opt.mean.size()) && ok_size(opt.std.size()), "transforms: mean has ",
                 opt.mean.size(), " and std ", opt.std.size(), " values; expected 1 or ", shape.c,
                 " (one per channel)");
  for (float s : opt.std) SPOTRAIN_CHECK(s > 0.0f, "transforms: std must be positive, got ", s);
  SPOTRAIN_CHECK(opt.pad >= 0, "transforms: pad must be >= 0, got ", opt.pad);
}

CropFlip draw_crop_flip(const TransformOptions& opt, uint64_t seed, int64_t epoch, int64_t sample_id) {
  Philox rng(seed, uint32_t(epoch), uint32_t(sample_id), uint32_t(uint64_t(sample_id) >> 32));
  const uint32_t span = uint32_t(2 * opt.pad + 1);
  CropFlip cf;
  cf.dy = int(rng.below(span)) - opt.pad;
  cf.dx = int(rng.below(span)) - opt.pad;
  bool heads = rng.uniform() < 0.5f;
  cf.flip = opt.flip && heads;
  return cf;
}

void apply_transform(const uint8_t* src, ImageShape shape, const TransformOptions& opt, CropFlip cf,
                     float* dst) {
  const int H = shape.h, W = shape.w, C = shape.c;
  // Per-channel mean and std (one value broadcasts; none means 0 and 1).
  float mean[16], stdv[16];
  std::vector<float> mean_big, std_big;
  float* m = mean;
  float* s = stdv;
  if (C > 16) {
    mean_big.resize(size_t(C));
    std_big.resize(size_t(C));
    m = mean_big.data();
    s = std_big.data();
  }
  for (int c = 0; c < C; ++c) {
    m[c] = opt.mean.empty() ? 0.0f : opt.mean[opt.mean.size() == 1 ? 0 : size_t(c)];
    s[c] = opt.std.empty() ? 1.0f : opt.std[opt.std.size() == 1 ? 0 : size_t(c)];
  }
  for (int y = 0; y < H; ++y) {
    const int sy = y + cf.dy;
    for (int x = 0; x < W; ++x) {
      const int sx = (cf.flip ? W - 1 - x : x) + cf.dx;
      const bool inside = sy >= 0 && sy < H && sx >= 0 && sx < W;
      const uint8_t* p = inside ? src + (int64_t(sy) * W + sx) * C : nullptr;
      float* q = dst + (int64_t(y) * W + x) * C;
      for (int c = 0; c < C; ++c) {
        const float v = inside ? float(p[c]) : 0.0f;
        q[c] = (v / 255.0f - m[c]) / s[c];
      }
    }
  }
}

void transform_image(const uint8_t* src, ImageShape shape, const TransformOptions& opt, bool train,
                     uint64_t seed, int64_t epoch, int64_t sample_id, float* dst) {
  apply_transform(src, shape, opt, train ? draw_crop_flip(opt, seed, epoch, sample_id) : CropFlip{},
                  dst);
}

TransformOptions fashion_mnist_transforms(bool train) {
  TransformOptions t;
  t.mean = {0.2860f};
  t.std = {0.3530f};
  t.pad = train ? 2 : 0;
  t.flip = train;
  return t;
}

}  // namespace io
}  // namespace spotrain
