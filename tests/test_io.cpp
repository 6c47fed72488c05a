// Unit tests for io/: IDX reading and its one-line errors, the distributed sampler,
// transforms (normalization, crop/flip draws) and the threaded loader's ordering,
// determinism across worker counts, resume and error propagation.
#include <gtest/gtest.h>
#include <zlib.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "io/sampler.h"
#include "io/transforms.h"

namespace fs = std::filesystem;
using namespace spotrain;
using namespace spotrain::io;

namespace {

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "spotrain_test_io_XXXXXX").string();
    char* p = mkdtemp(tmpl.data());
    if (!p) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void put_be32(std::vector<uint8_t>& out, uint32_t v) {
  out.push_back(uint8_t(v >> 24));
  out.push_back(uint8_t(v >> 16));
  out.push_back(uint8_t(v >> 8));
  out.push_back(uint8_t(v));
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes, bool gz) {
  if (gz) {
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr) << path;
    if (!bytes.empty()) {
      ASSERT_EQ(gzwrite(f, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
    }
    ASSERT_EQ(gzclose(f), Z_OK);
  } else {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    ASSERT_TRUE(f.good()) << path;
  }
}

// IDX images: header (magic, n, rows, cols) and the pixels; `pixels` may be shorter than the
// header says (a truncated file).
std::vector<uint8_t> idx_images(uint32_t n, uint32_t rows, uint32_t cols, const std::vector<uint8_t>& pixels,
                                uint32_t magic = 0x00000803) {
  std::vector<uint8_t> out;
  put_be32(out, magic);
  put_be32(out, n);
  put_be32(out, rows);
  put_be32(out, cols);
  out.insert(out.end(), pixels.begin(), pixels.end());
  return out;
}

std::vector<uint8_t> idx_labels(const std::vector<uint8_t>& labels, uint32_t magic = 0x00000801,
                                int64_t header_count = -1) {
  std::vector<uint8_t> out;
  put_be32(out, magic);
  put_be32(out, header_count < 0 ? uint32_t(labels.size()) : uint32_t(header_count));
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

// A small valid split: 5 images of 3x4, pixel k of image i = 12*i + k, labels below.
const std::vector<uint8_t> kLabels = {0, 3, 9, 1, 2};
std::vector<uint8_t> small_pixels(int n = 5) {
  std::vector<uint8_t> px(size_t(n) * 12);
  for (size_t k = 0; k < px.size(); ++k) px[k] = uint8_t(k);
  return px;
}

void write_split(const TempDir& d, const std::string& prefix, bool gz) {
  std::string ext = gz ? ".gz" : "";
  write_file(d.file(prefix + "-images-idx3-ubyte" + ext), idx_images(5, 3, 4, small_pixels()), gz);
  write_file(d.file(prefix + "-labels-idx1-ubyte" + ext), idx_labels(kLabels), gz);
}

// Runs fn, expects spotrain::Error whose message holds every piece and is one line.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& pieces) {
  try {
    fn();
    ADD_FAILURE() << "expected spotrain::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

}  // namespace

// ---------------------------------------------------------------- IDX datasets

TEST(IdxDataset, ReadsValuesAndLabelsGzipAndPlain) {
  TempDir d;
  write_split(d, "train", /*gz=*/true);
  write_split(d, "t10k", /*gz=*/false);
  for (const char* split : {"train", "test"}) {
    auto ds = load_idx_dataset(d.path(), split);
    ASSERT_EQ(ds->size(), 5);
    EXPECT_EQ(ds->num_classes(), 10);
    EXPECT_EQ(ds->image_shape().h, 3);
    EXPECT_EQ(ds->image_shape().w, 4);
    EXPECT_EQ(ds->image_shape().c, 1);
    std::vector<uint8_t> img(12);
    for (int i = 0; i < 5; ++i) {
      int32_t label = -1;
      ds->get(i, img.data(), &label);
      EXPECT_EQ(label, kLabels[size_t(i)]) << split << " " << i;
      for (int k = 0; k < 12; ++k) EXPECT_EQ(img[size_t(k)], uint8_t(12 * i + k));
    }
    EXPECT_THROW(ds->get(5, img.data(), nullptr), Error);
  }
}

TEST(IdxDataset, MissingFile) {
  TempDir d;
  expect_error([&] { load_idx_dataset(d.path(), "train"); },
               {d.file("train-images-idx3-ubyte.gz"), "No such file or directory",
                "install dataset-fashion-mnist or pass --data fashion-mnist:DIR"});
  // Images present, labels missing: the labels file is named.
  write_file(d.file("t10k-images-idx3-ubyte.gz"), idx_images(5, 3, 4, small_pixels()), true);
  expect_error([&] { load_idx_dataset(d.path(), "test"); },
               {d.file("t10k-labels-idx1-ubyte.gz"), "No such file or directory"});
  expect_error([&] { load_idx_dataset(d.path(), "validation"); }, {"validation"});
}

TEST(IdxDataset, WrongMagic) {
  TempDir d;
  write_file(d.file("train-images-idx3-ubyte.gz"), idx_images(5, 3, 4, small_pixels(), 0x00000801), true);
  write_file(d.file("train-labels-idx1-ubyte.gz"), idx_labels(kLabels), true);
  expect_error([&] { load_idx_dataset(d.path(), "train"); },
               {d.file("train-images-idx3-ubyte.gz"), "0x00000801", "0x00000803"});
  write_file(d.file("train-images-idx3-ubyte.gz"), idx_images(5, 3, 4, small_pixels()), true);
  write_file(d.file("train-labels-idx1-ubyte.gz"), idx_labels(kLabels, 0x00000803), true);
  expect_error([&] { load_idx_dataset(d.path(), "train"); },
               {d.file("train-labels-idx1-ubyte.gz"), "0x00000801", "0x00000803"});
}

TEST(IdxDataset, Truncated) {
  TempDir d;
  // Header says 5 images, 4.5 follow.
  std::vector<uint8_t> px = small_pixels();
  px.resize(54);
  write_file(d.file("train-images-idx3-ubyte.gz"), idx_images(5, 3, 4, px), true);
  write_file(d.file("train-labels-idx1-ubyte.gz"), idx_labels(kLabels), true);
  expect_error([&] { load_idx_dataset(d.path(), "train"); },
               {d.file("train-images-idx3-ubyte.gz"), "truncated", "60 bytes", "54"});
  // Labels header says 6, 5 follow (plain file).
  write_file(d.file("t10k-images-idx3-ubyte"), idx_images(5, 3, 4, small_pixels()), false);
  write_file(d.file("t10k-labels-idx1-ubyte"), idx_labels(kLabels, 0x00000801, 6), false);
  expect_error([&] { load_idx_dataset(d.path(), "test"); }, {d.file("t10k-labels-idx1-ubyte"), "truncated"});
  // Header itself cut short.
  write_file(d.file("t10k-labels-idx1-ubyte"), {0, 0, 8}, false);
  expect_error([&] { load_idx_dataset(d.path(), "test"); }, {d.file("t10k-labels-idx1-ubyte"), "truncated"});
}

TEST(IdxDataset, TruncatedGzipStream) {
  TempDir d;
  std::vector<uint8_t> px(2000 * 12);
  uint32_t s = 12345;  // incompressible-ish pixels so the cut lands inside the data
  for (auto& v : px) v = uint8_t((s = s * 1664525u + 1013904223u) >> 24);
  const std::string path = d.file("train-images-idx3-ubyte.gz");
  write_file(path, idx_images(2000, 3, 4, px), true);
  fs::resize_file(path, fs::file_size(path) / 2);
  write_file(d.file("train-labels-idx1-ubyte.gz"), idx_labels(std::vector<uint8_t>(2000, 1)), true);
  expect_error([&] { load_idx_dataset(d.path(), "train"); }, {path, "truncated"});
}

TEST(IdxDataset, LabelOutOfRange) {
  TempDir d;
  write_file(d.file("train-images-idx3-ubyte.gz"), idx_images(5, 3, 4, small_pixels()), true);
  write_file(d.file("train-labels-idx1-ubyte.gz"), idx_labels({0, 1, 10, 2, 3}), true);
  expect_error([&] { load_idx_dataset(d.path(), "train"); },
               {d.file("train-labels-idx1-ubyte.gz"), "label 10", "index 2"});
  // Fine with 11 classes; label 9 fails with num_classes 5.
  EXPECT_EQ(load_idx_dataset(d.path(), "train", 11)->num_classes(), 11);
  write_file(d.file("train-labels-idx1-ubyte.gz"), idx_labels(kLabels), true);
  expect_error([&] { load_idx_dataset(d.path(), "train", 5); }, {"label 9", "index 2"});
}

TEST(IdxDataset, CountMismatchAndEmpty) {
  TempDir d;
  write_file(d.file("train-images-idx3-ubyte.gz"), idx_images(5, 3, 4, small_pixels()), true);
  write_file(d.file("train-labels-idx1-ubyte.gz"), idx_labels({0, 1, 2, 3}), true);
  expect_error([&] { load_idx_dataset(d.path(), "train"); },
               {d.file("train-images-idx3-ubyte.gz"), d.file("train-labels-idx1-ubyte.gz"), "5 images", "4 labels"});
  write_file(d.file("train-images-idx3-ubyte.gz"), idx_images(0, 3, 4, {}), true);
  expect_error([&] { load_idx_dataset(d.path(), "train"); },
               {d.file("train-images-idx3-ubyte.gz"), "no images"});
}

TEST(Synthetic, DeterministicAndSubset) {
  ImageShape sh{5, 4, 3};
  auto a = make_synthetic_dataset(50, sh, 7, 42);
  auto b = make_synthetic_dataset(80, sh, 7, 42);
  auto c = make_synthetic_dataset(50, sh, 7, 43);
  std::vector<uint8_t> x(60), y(60);
  int32_t la, lb;
  bool differs = false;
  std::set<int> labels;
  for (int i = 0; i < 50; ++i) {
    a->get(i, x.data(), &la);
    b->get(i, y.data(), &lb);
    EXPECT_EQ(x, y);
    EXPECT_EQ(la, lb);
    EXPECT_GE(la, 0);
    EXPECT_LT(la, 7);
    labels.insert(la);
    c->get(i, y.data(), &lb);
    differs |= x != y;
  }
  EXPECT_TRUE(differs);
  EXPECT_GE(labels.size(), 5u);
  auto sub = take_first(b, 10);
  EXPECT_EQ(sub->size(), 10);
  sub->get(9, x.data(), &la);
  b->get(9, y.data(), &lb);
  EXPECT_EQ(x, y);
  EXPECT_THROW(sub->get(10, x.data(), &la), Error);
  expect_error([&] { take_first(b, 81); }, {"81"});
  EXPECT_THROW(make_synthetic_dataset(0, sh, 7, 1), Error);
}

// ---------------------------------------------------------------- sampler

TEST(Sampler, PermutationPerEpochAndSeed) {
  Sampler s(1000, 7, true);
  auto p0 = s.permutation(0), p1 = s.permutation(1);
  std::vector<int64_t> sorted = p0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[size_t(i)], i);
  sorted = p1;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[size_t(i)], i);
  EXPECT_NE(p0, p1);
  EXPECT_EQ(p0, Sampler(1000, 7, true).permutation(0));
  EXPECT_NE(p0, Sampler(1000, 8, true).permutation(0));
  auto id = Sampler(1000, 7, false).permutation(3);
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(id[size_t(i)], i);
}

TEST(Sampler, RankSlicesPartitionGlobalBatch) {
  const int64_t size = 103, G = 8;
  auto perm = Sampler(size, 3, true).permutation(2);
  const int64_t nb = Sampler::batches_per_epoch(size, G, true);
  ASSERT_EQ(nb, 12);
  for (int64_t b = 0; b < nb; ++b) {
    auto whole = Sampler::rank_slice(perm, b, G, 0, 1);
    ASSERT_EQ(whole, std::vector<int64_t>(perm.begin() + b * G, perm.begin() + (b + 1) * G));
    for (int world : {1, 2, 4}) {
      std::vector<int64_t> joined;
      std::set<int64_t> seen;
      for (int r = 0; r < world; ++r) {
        auto part = Sampler::rank_slice(perm, b, G, r, world);
        EXPECT_EQ(int64_t(part.size()), G / world);
        for (auto v : part) EXPECT_TRUE(seen.insert(v).second) << "overlap at " << v;
        joined.insert(joined.end(), part.begin(), part.end());
      }
      EXPECT_EQ(joined, whole) << "world " << world << " batch " << b;
    }
  }
  expect_error([&] { Sampler::rank_slice(perm, 0, 6, 0, 4); }, {"6", "4 ranks"});
  EXPECT_THROW(Sampler::rank_slice(perm, 12, G, 0, 1), Error);  // past the last full batch
}

// Over a whole epoch, 2 or 4 ranks together see every sample of the full global batches
// exactly once (disjoint, complete; only the last partial batch is dropped), and each
// rank's samples come in a different order every epoch.
TEST(Sampler, RanksCoverEachEpochOnceAndReshuffle) {
  const int64_t size = 103, per_rank = 6;
  Sampler s(size, 11, true);
  for (int world : {2, 4}) {
    const int64_t G = per_rank * world, nb = Sampler::batches_per_epoch(size, G, true);
    std::vector<std::vector<int64_t>> rank_order_prev(static_cast<size_t>(world));
    std::set<int64_t> dropped_prev;
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      auto perm = s.permutation(epoch);
      std::set<int64_t> seen;
      std::vector<std::vector<int64_t>> rank_order(static_cast<size_t>(world));
      for (int r = 0; r < world; ++r)
        for (int64_t b = 0; b < nb; ++b)
          for (auto v : Sampler::rank_slice(perm, b, G, r, world)) {
            EXPECT_TRUE(v >= 0 && v < size) << v;
            EXPECT_TRUE(seen.insert(v).second)
                << "sample " << v << " seen twice in epoch " << epoch << ", world " << world;
            rank_order[size_t(r)].push_back(v);
          }
      EXPECT_EQ(int64_t(seen.size()), nb * G) << "world " << world << " epoch " << epoch;
      std::set<int64_t> dropped;
      for (int64_t i = 0; i < size; ++i)
        if (!seen.count(i)) dropped.insert(i);
      EXPECT_EQ(int64_t(dropped.size()), size - nb * G);
      EXPECT_LT(int64_t(dropped.size()), G);
      // The dropped samples are the permutation's tail, so they change with the epoch.
      EXPECT_EQ(dropped, std::set<int64_t>(perm.begin() + nb * G, perm.end()));
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(int64_t(rank_order[size_t(r)].size()), nb * per_rank);
        if (epoch > 0) {
          EXPECT_NE(rank_order[size_t(r)], rank_order_prev[size_t(r)])
              << "rank " << r << " repeats its order in epoch " << epoch;
        }
      }
      if (epoch > 0) {
        EXPECT_NE(dropped, dropped_prev) << "the same samples are dropped every epoch";
      }
      rank_order_prev = rank_order;
      dropped_prev = dropped;
    }
  }
}

TEST(Sampler, BatchesPerEpoch) {
  EXPECT_EQ(Sampler::batches_per_epoch(103, 8, true), 12);
  EXPECT_EQ(Sampler::batches_per_epoch(103, 8, false), 13);
  EXPECT_EQ(Sampler::batches_per_epoch(96, 8, true), 12);
  EXPECT_EQ(Sampler::batches_per_epoch(96, 8, false), 12);
  EXPECT_EQ(Sampler::batches_per_epoch(7, 8, true), 0);
  EXPECT_EQ(Sampler::batches_per_epoch(60000, 256, true), 234);
  EXPECT_THROW(Sampler::batches_per_epoch(10, 0, true), Error);
}

TEST(Sampler, EvalSplitCoversAll) {
  for (int64_t size : {1, 2, 10, 103}) {
    for (int world : {1, 2, 3, 4, 7}) {
      std::vector<int64_t> joined;
      for (int r = 0; r < world; ++r) {
        auto part = eval_indices(size, r, world);
        EXPECT_LE(int64_t(part.size()), size / world + 1);
        EXPECT_GE(int64_t(part.size()), size / world);
        joined.insert(joined.end(), part.begin(), part.end());
      }
      ASSERT_EQ(int64_t(joined.size()), size);
      for (int64_t i = 0; i < size; ++i) EXPECT_EQ(joined[size_t(i)], i);
    }
  }
  EXPECT_THROW(eval_indices(10, 2, 2), Error);
}

// ---------------------------------------------------------------- transforms

namespace {
std::vector<uint8_t> random_image(ImageShape sh, uint32_t s) {
  std::vector<uint8_t> img(size_t(sh.numel()));
  for (auto& v : img) v = uint8_t((s = s * 1664525u + 1013904223u) >> 24);
  return img;
}
}  // namespace

TEST(Transforms, NormalizesKnownPixel) {
  ImageShape sh{2, 2, 3};
  std::vector<uint8_t> img = {0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 255};
  TransformOptions opt;
  opt.mean = {0.1f, 0.2f, 0.3f};
  opt.std = {0.5f, 0.25f, 0.2f};
  std::vector<float> out(12, NAN);
  transform_image(img.data(), sh, opt, false, 0, 0, 0, out.data());
  // pixel (y=1, x=0), channel 2 holds 80.
  EXPECT_NEAR(out[(1 * 2 + 0) * 3 + 2], (80 / 255.0 - 0.3) / 0.2, 1e-5);
  EXPECT_NEAR(out[11], (1.0 - 0.3) / 0.2, 1e-5);
  EXPECT_NEAR(out[0], (0.0 - 0.1) / 0.5, 1e-6);
  // Fashion-MNIST constants.
  auto fm = fashion_mnist_transforms(true);
  EXPECT_FLOAT_EQ(fm.mean.at(0), 0.2860f);
  EXPECT_FLOAT_EQ(fm.std.at(0), 0.3530f);
  EXPECT_EQ(fm.pad, 2);
  EXPECT_TRUE(fm.flip);
  EXPECT_EQ(fashion_mnist_transforms(false).pad, 0);
  EXPECT_FALSE(fashion_mnist_transforms(false).flip);
  uint8_t px = 128;
  float v = NAN;
  transform_image(&px, ImageShape{1, 1, 1}, fm, false, 0, 0, 0, &v);
  EXPECT_NEAR(v, (128 / 255.0 - 0.2860) / 0.3530, 1e-5);
  opt.mean = {0.1f, 0.2f};
  expect_error([&] { check_transform_options(opt, sh); }, {"mean", "3"});
}

TEST(Transforms, EvalPathIsIdentityCrop) {
  ImageShape sh{6, 5, 2};
  auto img = random_image(sh, 1);
  TransformOptions opt;
  opt.mean = {0.5f};
  opt.std = {0.25f};
  opt.pad = 2;
  opt.flip = true;
  std::vector<float> a(size_t(sh.numel()), NAN), b(size_t(sh.numel()), NAN);
  transform_image(img.data(), sh, opt, false, 9, 3, 17, a.data());
  transform_image(img.data(), sh, opt, false, 10, 4, 18, b.data());
  EXPECT_EQ(a, b);
  for (size_t i = 0; i < img.size(); ++i) EXPECT_FLOAT_EQ(a[i], (img[i] / 255.0f - 0.5f) / 0.25f);
}

TEST(Transforms, TrainDrawsDeterministicAndVaried) {
  ImageShape sh{8, 8, 1};
  auto img = random_image(sh, 2);
  TransformOptions opt = fashion_mnist_transforms(true);
  std::vector<float> a(64), b(64);
  transform_image(img.data(), sh, opt, true, 5, 1, 123456789012LL, a.data());
  transform_image(img.data(), sh, opt, true, 5, 1, 123456789012LL, b.data());
  EXPECT_EQ(a, b);
  std::set<int> dys, dxs;
  int flips = 0;
  std::set<std::vector<float>> outputs;
  for (int64_t id = 0; id < 400; ++id) {
    CropFlip cf = draw_crop_flip(opt, 5, 1, id);
    EXPECT_GE(cf.dy, -2);
    EXPECT_LE(cf.dy, 2);
    EXPECT_GE(cf.dx, -2);
    EXPECT_LE(cf.dx, 2);
    dys.insert(cf.dy);
    dxs.insert(cf.dx);
    flips += cf.flip;
    if (id < 40) {
      transform_image(img.data(), sh, opt, true, 5, 1, id, a.data());
      outputs.insert(a);
    }
  }
  EXPECT_EQ(dys.size(), 5u);
  EXPECT_EQ(dxs.size(), 5u);
  EXPECT_GT(flips, 150);
  EXPECT_LT(flips, 250);
  EXPECT_GT(outputs.size(), 20u);
  // The draw depends on epoch and seed as well, and ids above 2^32 are not aliased.
  int same_epoch = 0, same_seed = 0, same_hi = 0;
  for (int64_t id = 0; id < 100; ++id) {
    auto ref = draw_crop_flip(opt, 5, 1, id);
    auto e = draw_crop_flip(opt, 5, 2, id), s = draw_crop_flip(opt, 6, 1, id);
    auto h = draw_crop_flip(opt, 5, 1, id + (int64_t(1) << 32));
    same_epoch += e.dy == ref.dy && e.dx == ref.dx && e.flip == ref.flip;
    same_seed += s.dy == ref.dy && s.dx == ref.dx && s.flip == ref.flip;
    same_hi += h.dy == ref.dy && h.dx == ref.dx && h.flip == ref.flip;
  }
  EXPECT_LT(same_epoch, 20);
  EXPECT_LT(same_seed, 20);
  EXPECT_LT(same_hi, 20);
  // Without flip/pad in the options the draw is the identity.
  TransformOptions plain;
  for (int64_t id = 0; id < 50; ++id) {
    auto cf = draw_crop_flip(plain, 5, 1, id);
    EXPECT_TRUE(cf.dy == 0 && cf.dx == 0 && !cf.flip);
  }
}

TEST(Transforms, FlipMirrorsAndPadIsZero) {
  ImageShape sh{6, 7, 3};
  auto img = random_image(sh, 3);
  TransformOptions opt;
  opt.mean = {0.4f, 0.5f, 0.6f};
  opt.std = {0.2f, 0.3f, 0.4f};
  opt.pad = 2;
  opt.flip = true;
  int64_t id = 0;
  CropFlip cf;
  for (;; ++id) {
    cf = draw_crop_flip(opt, 11, 0, id);
    if (cf.flip && (cf.dx != 0 || cf.dy != 0)) break;
  }
  const size_t n = size_t(sh.numel());
  std::vector<float> drawn(n, NAN), flipped(n, NAN), unflipped(n, NAN);
  transform_image(img.data(), sh, opt, true, 11, 0, id, drawn.data());
  apply_transform(img.data(), sh, opt, cf, flipped.data());
  EXPECT_EQ(drawn, flipped);
  CropFlip nf = cf;
  nf.flip = false;
  apply_transform(img.data(), sh, opt, nf, unflipped.data());
  for (int y = 0; y < sh.h; ++y)
    for (int x = 0; x < sh.w; ++x)
      for (int c = 0; c < sh.c; ++c)
        ASSERT_EQ(flipped[size_t((y * sh.w + x) * sh.c + c)],
                  unflipped[size_t((y * sh.w + (sh.w - 1 - x)) * sh.c + c)]);
  // Shift down by 2 (dy = -2): the top two rows are padding, 0 in uint8 space.
  std::vector<float> shifted(n, NAN);
  apply_transform(img.data(), sh, opt, CropFlip{-2, 0, false}, shifted.data());
  for (int y = 0; y < sh.h; ++y)
    for (int x = 0; x < sh.w; ++x)
      for (int c = 0; c < sh.c; ++c) {
        float got = shifted[size_t((y * sh.w + x) * sh.c + c)];
        float want = y < 2 ? (0.0f - opt.mean[size_t(c)]) / opt.std[size_t(c)]
                           : (img[size_t(((y - 2) * sh.w + x) * sh.c + c)] / 255.0f - opt.mean[size_t(c)]) /
                                 opt.std[size_t(c)];
        ASSERT_FLOAT_EQ(got, want) << y << "," << x << "," << c;
      }
}

// ---------------------------------------------------------------- loader

namespace {

const ImageShape kShape{5, 4, 3};

std::shared_ptr<Dataset> synth(int64_t size = 103) { return make_synthetic_dataset(size, kShape, 10, 99); }

LoaderOptions loader_opts(int64_t batch, bool train, int workers = 1, int rank = 0, int world = 1) {
  LoaderOptions o;
  o.batch_size = batch;
  o.train = train;
  o.workers = workers;
  o.rank = rank;
  o.world = world;
  o.seed = 2024;
  o.transforms.mean = {0.3f, 0.4f, 0.5f};
  o.transforms.std = {0.2f, 0.25f, 0.3f};
  o.transforms.pad = train ? 1 : 0;
  o.transforms.flip = train;
  return o;
}

std::vector<Batch> drain(Loader& l) {
  std::vector<Batch> out;
  Batch b;
  while (l.next(b)) out.push_back(std::move(b));
  return out;
}

std::vector<Batch> epoch_batches(std::shared_ptr<const Dataset> ds, LoaderOptions o, int64_t epoch,
                                 int64_t first = 0) {
  Loader l(std::move(ds), std::move(o));
  l.start_epoch(epoch, first);
  return drain(l);
}

void expect_same_batch(const Batch& a, const Batch& b) {
  EXPECT_EQ(a.epoch, b.epoch);
  EXPECT_EQ(a.batch_index, b.batch_index);
  EXPECT_EQ(a.sample_ids, b.sample_ids);
  EXPECT_EQ(a.labels, b.labels);
  ASSERT_EQ(a.images.shape(), b.images.shape());
  EXPECT_EQ(std::memcmp(a.images.raw(), b.images.raw(), size_t(a.images.numel()) * 4), 0)
      << "batch " << a.batch_index;
}

// Fails on chosen sample ids; optionally slow, to catch a loader mid-batch.
class FaultyDataset final : public Dataset {
 public:
  FaultyDataset(std::shared_ptr<Dataset> base, std::set<int64_t> bad, bool spotrain_error, int sleep_us = 0)
      : base_(std::move(base)), bad_(std::move(bad)), spotrain_error_(spotrain_error), sleep_us_(sleep_us) {}
  int64_t size() const override { return base_->size(); }
  int num_classes() const override { return base_->num_classes(); }
  ImageShape image_shape() const override { return base_->image_shape(); }
  void get(int64_t i, uint8_t* out, int32_t* label) const override {
    if (sleep_us_) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    if (bad_.count(i)) {
      if (spotrain_error_) SPOTRAIN_THROW("faulty.rec: sample ", i, " is corrupt");
      throw std::runtime_error(str("disk read failed at sample ", i));
    }
    base_->get(i, out, label);
  }
  std::string name() const override { return "faulty"; }

 private:
  std::shared_ptr<Dataset> base_;
  std::set<int64_t> bad_;
  bool spotrain_error_;
  int sleep_us_;
};

}  // namespace

TEST(Loader, TrainEpochCoversSamplesOnceWithRightPixels) {
  auto ds = synth();
  Loader l(ds, loader_opts(8, true, 2));
  EXPECT_EQ(l.batches_per_epoch(), 12);
  EXPECT_EQ(l.samples_per_epoch(), 96);
  l.start_epoch(3);
  auto batches = drain(l);
  ASSERT_EQ(batches.size(), 12u);
  std::set<int64_t> seen;
  std::vector<uint8_t> raw(size_t(kShape.numel()));
  std::vector<float> want(size_t(kShape.numel()));
  const auto o = loader_opts(8, true);
  for (size_t b = 0; b < batches.size(); ++b) {
    const Batch& batch = batches[b];
    EXPECT_EQ(batch.epoch, 3);
    EXPECT_EQ(batch.batch_index, int64_t(b));
    ASSERT_EQ(batch.images.shape(), (Shape{8, 3, 5, 4}));
    EXPECT_EQ(batch.images.layout(), Layout::nhwc);
    EXPECT_EQ(batch.images.dtype(), DType::f32);
    ASSERT_EQ(batch.sample_ids.size(), 8u);
    ASSERT_EQ(batch.labels.size(), 8u);
    for (size_t i = 0; i < 8; ++i) {
      int64_t id = batch.sample_ids[i];
      EXPECT_TRUE(seen.insert(id).second) << "sample " << id << " twice";
      int32_t label;
      ds->get(id, raw.data(), &label);
      EXPECT_EQ(batch.labels[i], label);
      transform_image(raw.data(), kShape, o.transforms, true, o.seed, 3, id, want.data());
      EXPECT_EQ(std::memcmp(batch.images.data<float>() + i * kShape.numel(), want.data(), want.size() * 4), 0);
    }
  }
  EXPECT_EQ(seen.size(), 96u);
  // Order is the sampler's.
  auto perm = Sampler(103, 2024, true).permutation(3);
  EXPECT_EQ(batches[0].sample_ids, std::vector<int64_t>(perm.begin(), perm.begin() + 8));
  // The next epoch differs; a finished epoch keeps answering false.
  Batch extra;
  EXPECT_FALSE(l.next(extra));
  l.start_epoch(4);
  auto next_epoch = drain(l);
  ASSERT_EQ(next_epoch.size(), 12u);
  EXPECT_NE(next_epoch[0].sample_ids, batches[0].sample_ids);
}

TEST(Loader, RanksSplitTheSameGlobalBatches) {
  auto ds = synth();
  auto one = epoch_batches(ds, loader_opts(8, true), 1);
  for (int world : {2, 4}) {
    std::vector<std::vector<Batch>> per_rank;
    for (int r = 0; r < world; ++r) per_rank.push_back(epoch_batches(ds, loader_opts(8 / world, true, 2, r, world), 1));
    for (size_t b = 0; b < one.size(); ++b) {
      std::vector<int64_t> ids;
      std::vector<float> px;
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(per_rank[size_t(r)].size(), one.size());
        const Batch& part = per_rank[size_t(r)][b];
        ids.insert(ids.end(), part.sample_ids.begin(), part.sample_ids.end());
        px.insert(px.end(), part.images.data<float>(), part.images.data<float>() + part.images.numel());
      }
      EXPECT_EQ(ids, one[b].sample_ids) << "world " << world << " batch " << b;
      ASSERT_EQ(px.size(), size_t(one[b].images.numel()));
      EXPECT_EQ(std::memcmp(px.data(), one[b].images.raw(), px.size() * 4), 0);
    }
  }
}

// Gradient accumulation: micro-batch j of rank r with K per step is the batch rank r*K + j of
// world*K ranks sees, pixels included (so K micro-batches on one rank train as K ranks do, and a
// run resumed on fewer ranks with a larger K trains on the same batches); a step's micro-batches
// come in order under its batch_index; resuming at a step starts at its first micro-batch.
TEST(Loader, MicroBatchesOfARankAreTheBatchesOfKRanks) {
  auto ds = synth();
  for (auto [world, k] : {std::pair<int, int>{1, 4}, {2, 2}, {1, 2}}) {
    const int ranks = world * k;  // the run without accumulation
    std::vector<std::vector<Batch>> flat;
    for (int v = 0; v < ranks; ++v) flat.push_back(epoch_batches(ds, loader_opts(2, true, 2, v, ranks), 1));
    for (int r = 0; r < world; ++r) {
      auto o = loader_opts(2, true, 2, r, world);
      o.accum_steps = k;
      Loader l(ds, o);
      EXPECT_EQ(l.batches_per_epoch(), int64_t(flat[0].size())) << "steps per epoch";
      EXPECT_EQ(l.samples_per_epoch(), int64_t(flat[0].size()) * 2 * k);
      l.start_epoch(1);
      auto micro = drain(l);
      ASSERT_EQ(micro.size(), flat[0].size() * size_t(k)) << world << " x " << k;
      for (size_t m = 0; m < micro.size(); ++m) {
        const size_t step = m / size_t(k);
        const int j = int(m % size_t(k));
        EXPECT_EQ(micro[m].batch_index, int64_t(step));
        EXPECT_EQ(micro[m].micro, j);
        const Batch& want = flat[size_t(r * k + j)][step];
        EXPECT_EQ(micro[m].sample_ids, want.sample_ids)
            << world << " x " << k << ", rank " << r << " step " << step << " micro " << j;
        ASSERT_EQ(micro[m].images.numel(), want.images.numel());
        EXPECT_EQ(std::memcmp(micro[m].images.raw(), want.images.raw(), size_t(want.images.numel()) * 4), 0);
      }
      // Resumed at step 3: its first micro-batch comes first.
      l.start_epoch(1, 3);
      Batch b;
      ASSERT_TRUE(l.next(b));
      EXPECT_EQ(b.batch_index, 3);
      EXPECT_EQ(b.micro, 0);
      EXPECT_EQ(b.sample_ids, micro[size_t(3 * k)].sample_ids);
    }
  }
  auto o = loader_opts(8, true);
  o.accum_steps = 0;
  EXPECT_THROW(Loader(ds, o), Error);
  o.accum_steps = 13;  // 8 x 13 > 103 samples
  EXPECT_THROW(Loader(ds, o), Error);
}

TEST(Loader, EvalKeepsRemainderAndCoversAll) {
  auto ds = synth();
  std::vector<int64_t> all;
  for (int r = 0; r < 3; ++r) {
    Loader l(ds, loader_opts(8, false, 2, r, 3));
    int64_t slice = (r + 1) * 103 / 3 - r * 103 / 3;
    EXPECT_EQ(l.samples_per_epoch(), slice);
    EXPECT_EQ(l.batches_per_epoch(), (slice + 7) / 8);
    l.start_epoch(0);
    auto batches = drain(l);
    ASSERT_EQ(int64_t(batches.size()), l.batches_per_epoch());
    EXPECT_EQ(batches.back().images.dim(0), slice - 8 * (l.batches_per_epoch() - 1));
    EXPECT_LT(batches.back().images.dim(0), 8);
    for (auto& b : batches) all.insert(all.end(), b.sample_ids.begin(), b.sample_ids.end());
  }
  ASSERT_EQ(all.size(), 103u);
  for (int64_t i = 0; i < 103; ++i) EXPECT_EQ(all[size_t(i)], i);
  // Eval pixels ignore the epoch (no random transforms).
  auto e0 = epoch_batches(ds, loader_opts(8, false), 0);
  auto e5 = epoch_batches(ds, loader_opts(8, false), 5);
  ASSERT_EQ(e0.size(), e5.size());
  EXPECT_EQ(std::memcmp(e0[0].images.raw(), e5[0].images.raw(), size_t(e0[0].images.numel()) * 4), 0);
}

TEST(Loader, SameBatchesForAnyWorkerCount) {
  auto ds = synth();
  auto o1 = loader_opts(8, true, 1);
  o1.prefetch = 1;
  auto o3 = loader_opts(8, true, 3);
  o3.prefetch = 4;
  auto a = epoch_batches(ds, o1, 2), b = epoch_batches(ds, o3, 2);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) expect_same_batch(a[i], b[i]);
  auto ea = epoch_batches(ds, loader_opts(7, false, 1), 0), eb = epoch_batches(ds, loader_opts(7, false, 3), 0);
  ASSERT_EQ(ea.size(), eb.size());
  for (size_t i = 0; i < ea.size(); ++i) expect_same_batch(ea[i], eb[i]);
}

namespace {
std::atomic<int64_t> g_raw_allocs{0}, g_raw_frees{0};
void* counting_alloc(size_t bytes) {
  ++g_raw_allocs;
  return std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
}
void counting_free(void* p, size_t) {
  ++g_raw_frees;
  std::free(p);
}
}  // namespace

TEST(Loader, AllocatesImagesFromTheGivenAllocator) {
  auto ds = synth();
  Allocator counting(Device::cpu, Allocator::Raw{counting_alloc, counting_free, false});
  const int64_t allocs_before = g_raw_allocs.load();
  {
    auto o = loader_opts(8, true, 2);
    o.image_allocator = &counting;
    auto mine = epoch_batches(ds, o, 4);
    auto plain = epoch_batches(ds, loader_opts(8, true, 2), 4);
    ASSERT_EQ(mine.size(), plain.size());
    ASSERT_FALSE(mine.empty());
    for (size_t i = 0; i < mine.size(); ++i) {
      EXPECT_EQ(mine[i].images.storage()->alloc, &counting) << "batch " << i;
      EXPECT_EQ(plain[i].images.storage()->alloc, &Allocator::host()) << "batch " << i;
      expect_same_batch(mine[i], plain[i]);
    }
    EXPECT_GT(g_raw_allocs.load(), allocs_before);
    EXPECT_GE(counting.stats().current_bytes, mine.size() * size_t(mine[0].images.nbytes()));
  }
  EXPECT_EQ(counting.stats().current_bytes, 0u);  // every batch went back to it
  counting.release_cached();
  EXPECT_EQ(g_raw_frees.load(), g_raw_allocs.load());
}

TEST(Loader, ResumeMidEpochMatchesSkipping) {
  auto ds = synth();
  auto full = epoch_batches(ds, loader_opts(8, true, 2), 6);
  auto resumed = epoch_batches(ds, loader_opts(8, true, 2), 6, 5);
  ASSERT_EQ(resumed.size(), full.size() - 5);
  for (size_t i = 0; i < resumed.size(); ++i) expect_same_batch(resumed[i], full[i + 5]);
  EXPECT_TRUE(epoch_batches(ds, loader_opts(8, true), 6, 12).empty());
  Loader l(ds, loader_opts(8, true));
  EXPECT_THROW(l.start_epoch(6, 13), Error);
  // Restarting mid-epoch cancels the old one cleanly.
  auto o = loader_opts(8, true, 3);
  o.prefetch = 6;
  Loader m(ds, o);
  m.start_epoch(0);
  Batch b;
  ASSERT_TRUE(m.next(b));
  ASSERT_TRUE(m.next(b));
  m.start_epoch(6);
  auto again = drain(m);
  ASSERT_EQ(again.size(), full.size());
  for (size_t i = 0; i < again.size(); ++i) expect_same_batch(again[i], full[i]);
}

TEST(Loader, WorkerExceptionSurfacesFromNext) {
  auto base = synth();
  auto perm = Sampler(103, 2024, true).permutation(0);
  const int64_t bad = perm[8 * 4 + 3];  // in batch 4
  for (bool spotrain_error : {true, false}) {
    for (int workers : {1, 3}) {
      auto ds = std::make_shared<FaultyDataset>(base, std::set<int64_t>{bad}, spotrain_error);
      Loader l(ds, loader_opts(8, true, workers));
      l.start_epoch(0);
      Batch b;
      for (int i = 0; i < 4; ++i) ASSERT_TRUE(l.next(b));
      expect_error([&] { l.next(b); }, {"sample " + std::to_string(bad)});
      ASSERT_TRUE(l.next(b));  // the loader carries on after the bad batch
      EXPECT_EQ(b.batch_index, 5);
    }
  }
}

TEST(Loader, StopsCleanlyMidEpoch) {
  auto ds = std::make_shared<FaultyDataset>(synth(), std::set<int64_t>{}, true, /*sleep_us=*/300);
  for (int workers : {1, 3}) {
    auto o = loader_opts(8, true, workers);
    o.prefetch = 4;
    Loader l(ds, o);
    l.start_epoch(0);
    Batch b;
    ASSERT_TRUE(l.next(b));
  }  // destroyed with batches in flight
  { Loader idle(ds, loader_opts(8, true, 2)); }  // never started
}

TEST(Loader, ValidatesOptions) {
  auto ds = synth();
  expect_error([&] { Loader l(ds, loader_opts(0, true)); }, {"--batch-size must be positive"});
  expect_error([&] { Loader l(ds, loader_opts(60, true, 1, 0, 2)); },
               {"--batch-size 60 x 2 ranks is larger than the dataset (103 samples)"});
  EXPECT_NO_THROW(Loader(ds, loader_opts(200, false)));  // eval: one short batch is fine
  EXPECT_THROW(Loader(ds, loader_opts(8, true, 0)), Error);
  EXPECT_THROW(Loader(ds, loader_opts(8, true, 1, 2, 2)), Error);
  auto bad_norm = loader_opts(8, true);
  bad_norm.transforms.std = {1.0f, 0.0f, 1.0f};
  EXPECT_THROW(Loader(ds, bad_norm), Error);
  Loader l(ds, loader_opts(8, true));
  Batch b;
  expect_error([&] { l.next(b); }, {"start_epoch"});
}

// ---------------------------------------------------------------- the real Fashion-MNIST

TEST(FashionMnist, RealFilesIfInstalled) {
  const std::string dir = kDefaultFashionMnistDir;
  if (!fs::exists(dir + "/train-images-idx3-ubyte.gz") && !fs::exists(dir + "/train-images-idx3-ubyte"))
    GTEST_SKIP() << "Fashion-MNIST not installed in " << dir << " (package dataset-fashion-mnist)";
  auto train = load_idx_dataset(dir, "train");
  auto test = load_idx_dataset(dir, "test");
  EXPECT_EQ(train->size(), 60000);
  EXPECT_EQ(test->size(), 10000);
  for (auto* ds : {train.get(), test.get()}) {
    EXPECT_EQ(ds->image_shape().h, 28);
    EXPECT_EQ(ds->image_shape().w, 28);
    EXPECT_EQ(ds->image_shape().c, 1);
    std::vector<uint8_t> img(784);
    std::vector<int64_t> per_class(10, 0);
    for (int64_t i = 0; i < ds->size(); ++i) {
      int32_t label = -1;
      ds->get(i, img.data(), &label);
      ASSERT_GE(label, 0);
      ASSERT_LT(label, 10);
      per_class[size_t(label)]++;
    }
    for (auto c : per_class) EXPECT_EQ(c, ds->size() / 10);  // Fashion-MNIST is balanced
  }
  LoaderOptions o;
  o.batch_size = 128;
  o.transforms = fashion_mnist_transforms(true);
  o.workers = 2;
  Loader l(train, o);
  EXPECT_EQ(l.batches_per_epoch(), 468);
  l.start_epoch(0);
  Batch b;
  ASSERT_TRUE(l.next(b));
  ASSERT_EQ(b.images.shape(), (Shape{128, 1, 28, 28}));
  double sum = 0;
  for (int64_t i = 0; i < b.images.numel(); ++i) {
    float v = b.images.data<float>()[i];
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
  }
  EXPECT_LT(std::fabs(sum / double(b.images.numel())), 0.5);  // roughly centred by the mean/std
}
