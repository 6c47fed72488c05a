// Unit tests for the ImageNet-class input pipeline: JPEG decoding (RGB, grayscale, CMYK,
// DCT scaling, truncated and corrupt files), the transforms against analytic reference
// values, augmentation determinism across threads and ranks, packed shards, bad images.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/philox.h"
#include "image_folder_fixture.h"
#include "io/image_folder.h"
#include "io/shards.h"
#include "io/image_transforms.h"
#include "io/jpeg.h"
#include "io/loader.h"
#include "io/png.h"

namespace fs = std::filesystem;
using namespace spotrain;
using namespace spotrain::io;

namespace {

std::string temp_dir(const std::string& tag) {
  return (fs::temp_directory_path() / ("spotrain_img_" + tag + "_" + std::to_string(getpid()))).string();
}

// A smooth random RGB image (so JPEG keeps it well): low-frequency sums of cosines.
std::vector<uint8_t> smooth_image(int w, int h, uint64_t seed) {
  Philox rng(seed);
  float a[3][4];
  for (auto& c : a)
    for (auto& v : c) v = rng.uniform();
  std::vector<uint8_t> img(size_t(w) * size_t(h) * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        float v = 128 + 60 * std::cos(6.0f * a[c][0] * x / w + a[c][1] * 6) +
                  60 * std::cos(6.0f * a[c][2] * y / h + a[c][3] * 6);
        img[(size_t(y) * size_t(w) + size_t(x)) * 3 + size_t(c)] = uint8_t(std::lround(std::fmin(255, std::fmax(0, v))));
      }
  return img;
}

double mean_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += std::fabs(double(a[i]) - double(b[i]));
  return s / double(a.size());
}

// `pixels` (w x h, `channels` a pixel) through the codec at `quality`: the JPEG's header says
// `channels`, and `rgb` is what decode_jpeg_rgb makes of it at full size.
void jpeg_round_trip_to_rgb(const std::vector<uint8_t>& pixels, int w, int h, int channels, int quality,
                            std::vector<uint8_t>* rgb) {
  auto jpg = encode_jpeg(pixels.data(), w, h, channels, quality);
  JpegInfo info;
  ASSERT_TRUE(jpeg_info(jpg.data(), jpg.size(), &info));
  EXPECT_EQ(info.channels, channels);
  int ow = 0, oh = 0;
  decode_jpeg_rgb(jpg.data(), jpg.size(), 1, false, rgb, &ow, &oh);
}

}  // namespace

TEST(Jpeg, RgbRoundTripAndHeader) {
  auto img = smooth_image(75, 50, 1);
  auto jpg = encode_jpeg(img.data(), 75, 50, 3, 95);
  JpegInfo info;
  ASSERT_TRUE(jpeg_info(jpg.data(), jpg.size(), &info));
  EXPECT_EQ(info.width, 75);
  EXPECT_EQ(info.height, 50);
  EXPECT_EQ(info.channels, 3);
  std::vector<uint8_t> out;
  int w = 0, h = 0;
  decode_jpeg_rgb(jpg.data(), jpg.size(), 1, false, &out, &w, &h);
  ASSERT_EQ(w, 75);
  ASSERT_EQ(h, 50);
  EXPECT_LT(mean_abs_diff(img, out), 2.0);
}

TEST(Jpeg, DctScalingHalvesTheSizeAndKeepsThePicture) {
  auto img = smooth_image(100, 60, 2);
  auto jpg = encode_jpeg(img.data(), 100, 60, 3, 95);
  for (int d : {2, 4, 8}) {
    std::vector<uint8_t> out;
    int w = 0, h = 0;
    decode_jpeg_rgb(jpg.data(), jpg.size(), d, false, &out, &w, &h);
    EXPECT_EQ(w, jpeg_scaled(100, d));
    EXPECT_EQ(h, jpeg_scaled(60, d));
    // Compare with the full image box-averaged over d x d blocks.
    double err = 0;
    int n = 0;
    for (int y = 0; y < 60 / d; ++y)
      for (int x = 0; x < 100 / d; ++x)
        for (int c = 0; c < 3; ++c) {
          double s = 0;
          for (int dy = 0; dy < d; ++dy)
            for (int dx = 0; dx < d; ++dx) s += img[(size_t(y * d + dy) * 100 + size_t(x * d + dx)) * 3 + size_t(c)];
          err += std::fabs(s / (d * d) - out[(size_t(y) * size_t(w) + size_t(x)) * 3 + size_t(c)]);
          ++n;
        }
    EXPECT_LT(err / n, 4.0) << "1/" << d;
  }
}

// Region decoding reads only part of the file but must give the full decode's pixels there.
TEST(Jpeg, RegionDecodeMatchesFullDecode) {
  auto img = smooth_image(203, 150, 4);
  auto jpg = encode_jpeg(img.data(), 203, 150, 3, 90);
  for (int d : {1, 2}) {
    std::vector<uint8_t> full, part;
    int w = 0, h = 0;
    decode_jpeg_rgb(jpg.data(), jpg.size(), d, false, &full, &w, &h);
    JpegRegion want{37 / d, 41 / d, 90 / d, 70 / d}, got;
    decode_jpeg_region(jpg.data(), jpg.size(), d, false, want, &part, &got);
    EXPECT_LE(got.x, want.x);
    EXPECT_LE(got.y, want.y);
    EXPECT_GE(got.x + got.w, want.x + want.w);
    EXPECT_GE(got.y + got.h, want.y + want.h);
    EXPECT_LT(got.y + got.h, h);  // the rows below were not decoded
    int worst = 0;
    double sum = 0;
    for (int y = want.y; y < want.y + want.h; ++y)  // the pixels asked for; the margin may differ
      for (int x = want.x; x < want.x + want.w; ++x)
        for (int c = 0; c < 3; ++c) {
          const int diff = std::abs(int(part[(size_t(y - got.y) * size_t(got.w) + size_t(x - got.x)) * 3 + size_t(c)]) -
                                    int(full[(size_t(y) * size_t(w) + size_t(x)) * 3 + size_t(c)]));
          worst = std::max(worst, diff);
          sum += diff;
        }
    EXPECT_EQ(worst, 0) << "1/" << d << ", mean difference " << sum / (got.w * got.h * 3.0);
  }
  std::vector<uint8_t> cut(jpg.begin(), jpg.begin() + long(jpg.size() * 3 / 4)), out;
  JpegRegion got;
  EXPECT_THROW(decode_jpeg_region(cut.data(), cut.size(), 1, false, JpegRegion{0, 0, 10, 10}, &out, &got), Error);
}

TEST(Jpeg, GrayscaleBecomesThreeEqualChannels) {
  std::vector<uint8_t> g(40 * 30);
  for (size_t i = 0; i < g.size(); ++i) g[i] = uint8_t(40 + (i % 40) * 4);
  std::vector<uint8_t> out;
  ASSERT_NO_FATAL_FAILURE(jpeg_round_trip_to_rgb(g, 40, 30, 1, 95, &out));
  double err = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_EQ(out[3 * i], out[3 * i + 1]);
    ASSERT_EQ(out[3 * i], out[3 * i + 2]);
    err += std::fabs(double(out[3 * i]) - g[i]);
  }
  EXPECT_LT(err / double(g.size()), 2.0);
}

TEST(Jpeg, CmykConvertsAsPil) {
  const int w = 32, h = 24;
  std::vector<uint8_t> cmyk(size_t(w) * h * 4);
  for (int i = 0; i < w * h; ++i) {  // flat regions, so the codec keeps them nearly exact
    cmyk[size_t(4 * i)] = 40;
    cmyk[size_t(4 * i + 1)] = uint8_t(i % w < w / 2 ? 200 : 10);
    cmyk[size_t(4 * i + 2)] = 120;
    cmyk[size_t(4 * i + 3)] = 30;
  }
  std::vector<uint8_t> out;
  ASSERT_NO_FATAL_FAILURE(jpeg_round_trip_to_rgb(cmyk, w, h, 4, 100, &out));
  // Pixel (2, 2) lies in the left region: R = (255-C)(255-K)/255 (PIL's CMYK -> RGB).
  const size_t p = (size_t(2) * size_t(w) + 2) * 3;
  EXPECT_NEAR(out[p], (255 - 40) * (255 - 30) / 255.0, 3.0);
  EXPECT_NEAR(out[p + 1], (255 - 200) * (255 - 30) / 255.0, 3.0);
  EXPECT_NEAR(out[p + 2], (255 - 120) * (255 - 30) / 255.0, 3.0);
}

TEST(Jpeg, TruncatedAndCorruptFilesThrow) {
  auto img = smooth_image(64, 48, 3);
  auto jpg = encode_jpeg(img.data(), 64, 48, 3, 90);
  std::vector<uint8_t> out;
  int w, h;
  std::vector<uint8_t> cut(jpg.begin(), jpg.begin() + long(jpg.size() / 2));
  EXPECT_THROW(decode_jpeg_rgb(cut.data(), cut.size(), 1, false, &out, &w, &h), Error);
  std::vector<uint8_t> junk(500, 0x5A);
  JpegInfo info;
  std::string why;
  EXPECT_FALSE(jpeg_info(junk.data(), junk.size(), &info, &why));
  EXPECT_FALSE(why.empty());
  EXPECT_THROW(decode_jpeg_rgb(junk.data(), junk.size(), 1, false, &out, &w, &h), Error);
}

// Naive float64 reference of PIL's bilinear resize of a box (crop, then resize): output
// (i, j) weighs source pixel (k, l) of the box by tri((k - cy + 0.5) / fy) * tri((l - cx + 0.5) / fx)
// over the whole box, each axis normalized, with c = box start + (index + 0.5) * scale and
// f = max(scale, 1). On a linear image the result is also close to f at the sample point.
TEST(ImageTransforms, ResampleCropFlipNormalizeMatchReference) {
  const int W = 64, H = 48;
  auto f = [](double x, double y, int c) {
    return c == 0 ? 10 + 2 * x + y : c == 1 ? 20 + x + 3 * y : 230 - x - y;
  };
  std::vector<uint8_t> img(size_t(W) * H * 3);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      for (int c = 0; c < 3; ++c) img[(size_t(y) * W + size_t(x)) * 3 + size_t(c)] = uint8_t(f(x, y, c));
  auto tri = [](double t) { return std::fabs(t) < 1 ? 1 - std::fabs(t) : 0.0; };
  ImageTransformOptions opt;
  opt.out_size = 16;
  for (int out_size : {16, 56}) {  // shrinking (antialiased) and enlarging
    opt.out_size = out_size;
    for (int mode = 0; mode < 3; ++mode) {
      const bool flip = mode == 1, clip = mode != 2;  // mode 2: resize-then-crop (eval) taps
      CropBox box;
      box.x = 8;
      box.y = 6;
      box.w = 40;
      box.h = 30;
      box.flip = flip;
      box.clip = clip;  // crop-then-resize: taps inside the box; else up to the image edge
      const int n = out_size;
      std::vector<float> out(size_t(n) * n * 3, -1e9f), scratch;
      resample_normalize(img.data(), W, H, box, opt, out.data(), &scratch);
      const double sx = box.w / n, sy = box.h / n, fx = std::max(sx, 1.0), fy = std::max(sy, 1.0);
      double max_err = 0, max_lin = 0;
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          const double cx = box.x + (j + 0.5) * sx, cy = box.y + (i + 0.5) * sy;
          double acc[3] = {0, 0, 0}, wsum = 0;
          for (int k = clip ? int(box.y) : 0; k < (clip ? int(box.y + box.h) : H); ++k)
            for (int l = clip ? int(box.x) : 0; l < (clip ? int(box.x + box.w) : W); ++l) {
              const double w = tri((k - cy + 0.5) / fy) * tri((l - cx + 0.5) / fx);
              wsum += w;
              for (int c = 0; c < 3; ++c) acc[c] += w * img[(size_t(k) * W + size_t(l)) * 3 + size_t(c)];
            }
          const int oj = flip ? n - 1 - j : j;
          for (int c = 0; c < 3; ++c) {
            const double v = acc[c] / wsum;
            const double want = (v / 255.0 - opt.mean[c]) / opt.std[c];
            const float got = out[(size_t(i) * size_t(n) + size_t(oj)) * 3 + size_t(c)];
            max_err = std::max(max_err, std::fabs(got - want));
            // away from the box edges the filter nearly reproduces the linear image
            if (cx - 2 * fx > box.x && cx + 2 * fx < box.x + box.w && cy - 2 * fy > box.y &&
                cy + 2 * fy < box.y + box.h)
              max_lin = std::max(max_lin, std::fabs(got * opt.std[c] + opt.mean[c] - f(cx - 0.5, cy - 0.5, c) / 255.0));
          }
        }
      EXPECT_LT(max_err, 1e-4) << "out " << n << " mode " << mode;
      EXPECT_LT(max_lin, 0.5 / 255.0) << "out " << n << " mode " << mode;
      for (float v : out) ASSERT_GT(v, -1e8f);  // every element written
    }
  }
}

TEST(ImageTransforms, CenterCropBoxFollowsTorchvisionSizes) {
  ImageTransformOptions opt;  // 256 -> 224
  // 500x375: Resize(256) gives 341x256 (int(256*500/375)); CenterCrop(224) keeps
  // left round((341-224)/2) = 58 (half to even), top 16; in source pixels * 500/341.
  CropBox b = center_crop_box(500, 375, opt);
  const double s = 500.0 / 341.0, t = 375.0 / 256.0;
  EXPECT_NEAR(b.x, 58 * s, 1e-9);
  EXPECT_NEAR(b.y, 16 * t, 1e-9);
  EXPECT_NEAR(b.w, 224 * s, 1e-9);
  EXPECT_NEAR(b.h, 224 * t, 1e-9);
  EXPECT_FALSE(b.flip);
  // Portrait: the width is the shorter side.
  CropBox p = center_crop_box(300, 400, opt);
  EXPECT_NEAR(p.w, 224 * 300.0 / 256.0, 1e-9);
  EXPECT_NEAR(p.h, 224 * 400.0 / int(256 * 400 / 300), 1e-9);
}

TEST(ImageTransforms, RandomResizedCropDrawsInRangeAndDeterministic) {
  ImageTransformOptions opt;
  int flips = 0, fallbacks = 0;
  const int W = 500, H = 375, n = 2000;
  for (int64_t id = 0; id < n; ++id) {
    CropBox b = random_resized_crop(W, H, opt, true, 7, 3, id);
    ASSERT_GE(b.x, 0);
    ASSERT_GE(b.y, 0);
    ASSERT_LE(b.x + b.w, W);
    ASSERT_LE(b.y + b.h, H);
    ASSERT_EQ(b.x, std::floor(b.x));
    const double frac = b.w * b.h / (double(W) * H), ratio = b.w / b.h;
    if (b.w == W || b.h == H) ++fallbacks;
    // rounding w and h to integers moves area and ratio a little
    EXPECT_GE(frac, 0.08 * 0.95);
    EXPECT_LE(ratio, 4.0 / 3.0 * 1.05);
    EXPECT_GE(ratio, 3.0 / 4.0 / 1.05);
    flips += b.flip;
    CropBox again = random_resized_crop(W, H, opt, true, 7, 3, id);
    ASSERT_EQ(again.x, b.x);
    ASSERT_EQ(again.w, b.w);
    ASSERT_EQ(again.flip, b.flip);
  }
  EXPECT_NEAR(flips / double(n), 0.5, 0.05);
  EXPECT_LT(fallbacks, n / 4);
  CropBox e0 = random_resized_crop(W, H, opt, true, 7, 3, 5), e1 = random_resized_crop(W, H, opt, true, 7, 4, 5);
  EXPECT_FALSE(e0.x == e1.x && e0.y == e1.y && e0.w == e1.w);
  EXPECT_FALSE(random_resized_crop(W, H, opt, false, 7, 3, 5).flip);
}

TEST(ImageTransforms, JpegDenomKeepsTheCropAtLeastOutputSize) {
  CropBox b;
  b.w = 900;
  b.h = 460;
  EXPECT_EQ(pick_jpeg_denom(b, 224), 2);
  b.h = 1800;
  b.w = 1800;
  EXPECT_EQ(pick_jpeg_denom(b, 224), 8);
  b.w = 300;
  EXPECT_EQ(pick_jpeg_denom(b, 224), 1);
}

class ImageFolderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { fx_ = make_fashion_image_folder(temp_dir("folder"), 12, 3); }
  static void TearDownTestSuite() { fs::remove_all(fx_.root); }
  static ImageFolderFixture fx_;

  static std::vector<Batch> all_batches(std::shared_ptr<const Dataset> d, LoaderOptions lo, int64_t epoch) {
    Loader l(d, lo);
    l.start_epoch(epoch);
    std::vector<Batch> out;
    Batch b;
    while (l.next(b)) out.push_back(b);
    return out;
  }
  static LoaderOptions options(int workers, int64_t batch, bool train = true) {
    LoaderOptions lo;
    lo.batch_size = batch;
    lo.train = train;
    lo.seed = 11;
    lo.workers = workers;
    lo.image.out_size = 24;
    lo.image.resize = 27;
    lo.max_bad_fraction = 0.05;
    return lo;
  }
  static bool same_pixels(const Batch& a, const Batch& b) {
    return a.images.numel() == b.images.numel() &&
           std::memcmp(a.images.raw(), b.images.raw(), a.images.nbytes()) == 0 && a.labels == b.labels;
  }
};
ImageFolderFixture ImageFolderTest::fx_;

TEST_F(ImageFolderTest, LabelsFromSortedClassNames) {
  auto d = open_image_folder(fx_.root + "/train", {}, 24);
  EXPECT_EQ(d->num_classes(), 10);
  EXPECT_EQ(d->size(), 10 * 12 + 2);
  auto names = d->class_names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  std::vector<uint8_t> bytes;
  int32_t label = -1;
  d->read_encoded(0, &bytes, &label);
  EXPECT_EQ(label, 0);
  EXPECT_NE(d->sample_name(0).find(names[0]), std::string::npos);
  d->read_encoded(d->size() - 1, &bytes, &label);
  EXPECT_EQ(label, 9);
  auto v = open_image_folder(fx_.root + "/val", names, 24);
  EXPECT_EQ(v->size(), 30);
  EXPECT_THROW(open_image_folder(fx_.root + "/val", {"only_one"}, 24), Error);
}

TEST_F(ImageFolderTest, AugmentationIdenticalAcrossWorkerCounts) {
  auto d = std::shared_ptr<const Dataset>(open_image_folder(fx_.root + "/train", {}, 24));
  for (int64_t epoch : {0, 1}) {
    auto one = all_batches(d, options(1, 10), epoch);
    auto two = all_batches(d, options(2, 10), epoch);
    ASSERT_EQ(one.size(), two.size());
    ASSERT_EQ(one.size(), size_t(d->size() / 10));
    for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(same_pixels(one[i], two[i])) << "batch " << i;
    // no poison left: values are normalized pixels, all finite and bounded
    for (int64_t k = 0; k < one[0].images.numel(); ++k) {
      float v = one[0].images.data<float>()[k];
      ASSERT_TRUE(std::isfinite(v) && v > -3.0f && v < 3.0f);
    }
  }
  auto e0 = all_batches(d, options(1, 10), 0), e1 = all_batches(d, options(1, 10), 1);
  EXPECT_FALSE(same_pixels(e0[0], e1[0]));
}

TEST_F(ImageFolderTest, AugmentationIdenticalAcrossRankCounts) {
  auto d = std::shared_ptr<const Dataset>(open_image_folder(fx_.root + "/train", {}, 24));
  auto whole = all_batches(d, options(1, 20), 2);
  LoaderOptions r0 = options(2, 10), r1 = options(1, 10);
  r0.world = r1.world = 2;
  r1.rank = 1;
  auto a = all_batches(d, r0, 2), b = all_batches(d, r1, 2);
  ASSERT_EQ(a.size(), whole.size());
  const size_t half = whole[0].images.nbytes() / 2;
  for (size_t i = 0; i < whole.size(); ++i) {
    ASSERT_EQ(std::memcmp(whole[i].images.raw(), a[i].images.raw(), half), 0) << "batch " << i;
    ASSERT_EQ(std::memcmp(static_cast<char*>(whole[i].images.raw()) + half, b[i].images.raw(), half), 0);
  }
}

// The loader's region decode + resample against the plain path: whole-image decode, the
// crop drawn for (seed, epoch, id), resample. The same pixels (up to float summation order).
TEST_F(ImageFolderTest, LoaderPixelsMatchWholeImageReference) {
  auto d = std::shared_ptr<const Dataset>(open_image_folder(fx_.root + "/train", {}, 24));
  for (bool train : {true, false}) {
    LoaderOptions lo = options(1, 10, train);
    auto batches = all_batches(d, lo, 3);
    std::vector<uint8_t> bytes, rgb;
    std::vector<float> ref(24 * 24 * 3), scratch;
    double worst = 0;
    int compared = 0;
    for (size_t bi = 0; bi < 3; ++bi) {
      const Batch& b = batches[bi];
      for (size_t i = 0; i < b.sample_ids.size(); ++i) {
        int32_t label;
        d->read_encoded(b.sample_ids[i], &bytes, &label);
        JpegInfo info;
        if (!jpeg_info(bytes.data(), bytes.size(), &info)) continue;  // the corrupt one
        int w, h;
        try {
          decode_jpeg_rgb(bytes.data(), bytes.size(), 1, false, &rgb, &w, &h);
        } catch (const Error&) {
          continue;  // the truncated one
        }
        ASSERT_EQ(label, b.labels[i]);
        CropBox box = train ? random_resized_crop(w, h, lo.image, true, lo.seed, 3, b.sample_ids[i])
                            : center_crop_box(w, h, lo.image);
        resample_normalize(rgb.data(), w, h, box, lo.image, ref.data(), &scratch);
        const float* got = b.images.data<float>() + i * ref.size();
        for (size_t k = 0; k < ref.size(); ++k) worst = std::max(worst, double(std::fabs(got[k] - ref[k])));
        ++compared;
      }
    }
    EXPECT_GT(compared, 25);
    EXPECT_LT(worst, 1e-4) << (train ? "train" : "eval");
  }
}

// pixels_u8: the same crops resampled into 8-bit pixels (for the GPU to normalize) instead of
// normalized floats: normalized as upload_pixels does, each within half a pixel step (plus
// float error) of the fp32 batch; erasing and mixup, which work on normalized pixels, keep
// the fp32 batches.
TEST_F(ImageFolderTest, EightBitBatchesAreTheNormalizedPixelsRounded) {
  auto d = std::shared_ptr<const Dataset>(open_image_folder(fx_.root + "/train", {}, 24));
  for (bool train : {true, false}) {
    LoaderOptions lo = options(2, 10, train), lu = lo;
    lu.pixels_u8 = true;
    EXPECT_TRUE(Loader(d, lu).pixels_u8());
    auto f = all_batches(d, lo, 1), u = all_batches(d, lu, 1);
    ASSERT_EQ(f.size(), u.size());
    double worst = 0, norm_std = 0;
    int64_t differ = 0;
    for (size_t b = 0; b < f.size(); ++b) {
      ASSERT_EQ(u[b].images.dtype(), DType::u8);
      ASSERT_EQ(u[b].images.shape(), f[b].images.shape());
      EXPECT_EQ(u[b].labels, f[b].labels);
      const PixelNorm& nm = u[b].norm;
      const uint8_t* pu = static_cast<const uint8_t*>(u[b].images.raw());
      const float* pf = f[b].images.data<float>();
      for (int64_t k = 0; k < f[b].images.numel(); ++k) {
        const int c = int(k % 3);
        const double v = std::fma(float(pu[k]), nm.scale(c), nm.shift(c));
        worst = std::max(worst, std::fabs(v - pf[k]) / (0.5 * nm.scale(c)));
        differ += v != pf[k];
      }
      norm_std = std::max(norm_std, double(nm.std[0]));
    }
    EXPECT_LE(worst, 1.001) << (train ? "train" : "eval") << ": in half pixel steps";
    EXPECT_GT(differ, 0);
    EXPECT_EQ(norm_std, double(lo.image.std[0]));  // the batch carries the loader's normalization
  }
  LoaderOptions erase = options(1, 10), mix = options(1, 10);
  erase.pixels_u8 = mix.pixels_u8 = true;
  erase.erasing.p = 0.5f;
  mix.mix.mixup_alpha = 0.2f;
  for (const LoaderOptions& lo : {erase, mix}) {
    Loader l(d, lo);
    EXPECT_FALSE(l.pixels_u8());
    l.start_epoch(0);
    Batch b;
    ASSERT_TRUE(l.next(b));
    EXPECT_EQ(b.images.dtype(), DType::f32);
  }
}

TEST_F(ImageFolderTest, BadImagesSkippedCountedAndReported) {
  auto d = std::shared_ptr<const Dataset>(open_image_folder(fx_.root + "/train", {}, 24));
  LoaderOptions lo = options(2, 10);
  Loader l(d, lo);
  for (int64_t e = 0; e < 2; ++e) {  // two epochs see every sample (drop_last leaves 2 out)
    l.start_epoch(e);
    Batch b;
    while (l.next(b)) {
      for (int32_t lab : b.labels) ASSERT_TRUE(lab >= 0 && lab < 10);
    }
  }
  auto bad = l.bad_samples();
  ASSERT_EQ(bad.size(), 2u);
  std::string all = bad[0].what + "\n" + bad[1].what;
  EXPECT_NE(all.find(fx_.corrupt), std::string::npos) << all;
  EXPECT_NE(all.find(fx_.truncated), std::string::npos) << all;
  // Over the limit (2 of 122 > 1%): the loader stops with a clear error.
  lo.max_bad_fraction = 0.01;
  lo.train = false;  // eval order reads every sample
  Loader strict(d, lo);
  strict.start_epoch(0);
  Batch b;
  try {
    while (strict.next(b)) {
    }
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--max-bad-fraction"), std::string::npos) << e.what();
    // The line names the first bad image (the one each worker met first), not the latest.
    const auto met = strict.bad_samples();
    ASSERT_FALSE(met.empty());
    EXPECT_NE(std::string(e.what()).find("the first: " + met.front().what), std::string::npos) << e.what();
  }
}

TEST_F(ImageFolderTest, PackThenReadGivesIdenticalBatches) {
  auto folder = open_image_folder(fx_.root + "/train", {}, 24);
  const std::string out = temp_dir("shards");
  fs::remove_all(out);
  PackStats st = pack_shards(*folder, out, 1500);  // tiny shards: several files
  EXPECT_EQ(st.records, folder->size());
  EXPECT_GT(st.shards, 3);
  std::vector<std::string> notes;
  EXPECT_TRUE(verify_shards(out, &notes).empty());
  EXPECT_EQ(notes.size(), 1u);  // the corrupt file is packed as it is, and noted (truncated JPEGs pass)
  auto shards = std::shared_ptr<const Dataset>(open_shards(out, 24));
  EXPECT_EQ(shards->size(), folder->size());
  EXPECT_EQ(shards->class_names(), folder->class_names());
  auto fd = std::shared_ptr<const Dataset>(folder);
  for (bool train : {true, false}) {
    auto a = all_batches(fd, options(2, 10, train), 1), b = all_batches(shards, options(2, 10, train), 1);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_pixels(a[i], b[i])) << "batch " << i;
  }
  // One flipped byte inside a record: verify names the CRC mismatch.
  {
    std::fstream f(out + "/shard-00001.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    char c;
    f.read(&c, 1);
    c = char(c ^ 0x40);
    f.seekp(200);
    f.write(&c, 1);
  }
  auto p = verify_shards(out);
  ASSERT_FALSE(p.empty());
  EXPECT_NE(p[0].find("CRC"), std::string::npos) << p[0];
  // A truncated shard: verify says the record lies outside it.
  fs::resize_file(out + "/shard-00002.bin", 100);
  p = verify_shards(out);
  bool outside = false;
  for (auto& s : p) outside |= s.find("outside") != std::string::npos;
  EXPECT_TRUE(outside);
  EXPECT_THROW(open_shards(out, 24), Error);
  fs::remove_all(out);
}

TEST(Png, DecodesExactlyAndGoesThroughTheLoader) {
  const int W = 40, H = 30;
  auto img = smooth_image(W, H, 9);
  std::vector<uint8_t> rgba(size_t(W) * H * 4);
  for (int i = 0; i < W * H; ++i) {
    for (int c = 0; c < 3; ++c) rgba[size_t(4 * i + c)] = img[size_t(3 * i + c)];
    rgba[size_t(4 * i + 3)] = uint8_t(i % 251);  // alpha is dropped, as PIL's convert("RGB")
  }
  auto png = encode_png(rgba.data(), W, H, 4);
  ASSERT_TRUE(is_png(png.data(), png.size()));
  std::vector<uint8_t> out;
  int w = 0, h = 0;
  decode_png_rgbx(png.data(), png.size(), &out, &w, &h);
  ASSERT_EQ(w, W);
  ASSERT_EQ(h, H);
  EXPECT_EQ(out, rgba);
  std::vector<uint8_t> cut(png.begin(), png.begin() + long(png.size() / 2));
  EXPECT_THROW(decode_png_rgbx(cut.data(), cut.size(), &out, &w, &h), Error);
  // A folder with a PNG among JPEGs: the loader's pixels are the PNG's, transformed.
  const std::string root = temp_dir("png");
  fs::remove_all(root);
  fs::create_directories(root + "/cls");
  write_bytes(root + "/cls/a.png", png, png.size());
  auto jpg = encode_jpeg(img.data(), W, H, 3, 90);
  write_bytes(root + "/cls/b.JPEG", jpg, jpg.size());
  auto d = std::shared_ptr<const Dataset>(open_image_folder(root, {}, 24));
  ASSERT_EQ(d->size(), 2);
  LoaderOptions lo;
  lo.batch_size = 2;
  lo.train = false;
  lo.image.out_size = 24;
  lo.image.resize = 27;
  Loader l(d, lo);
  l.start_epoch(0);
  Batch b;
  ASSERT_TRUE(l.next(b));
  std::vector<float> ref(24 * 24 * 3), scratch;
  resample_normalize(img.data(), W, H, center_crop_box(W, H, lo.image), lo.image, ref.data(), &scratch, 3);
  double worst = 0;
  for (size_t k = 0; k < ref.size(); ++k) worst = std::max(worst, double(std::fabs(b.images.data<float>()[k] - ref[k])));
  EXPECT_LT(worst, 1e-5);
  EXPECT_TRUE(l.bad_samples().empty());
  fs::remove_all(root);
}

TEST(ParseBytes, UnitsAndErrors) {
  EXPECT_EQ(parse_bytes("1GiB"), int64_t(1) << 30);
  EXPECT_EQ(parse_bytes("512MiB"), int64_t(512) << 20);
  EXPECT_EQ(parse_bytes("100MB"), int64_t(100000000));
  EXPECT_EQ(parse_bytes("4096"), 4096);
  EXPECT_THROW(parse_bytes("lots"), Error);
  EXPECT_THROW(parse_bytes("5 parsecs"), Error);
}
