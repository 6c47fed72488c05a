// Datasets and transforms from a --data spec (see data.h).
#include "engine/data.h"

#include <cmath>

#include "core/error.h"
#include "io/image_folder.h"
#include "io/shards.h"

namespace spotrain {

io::TransformOptions transforms_for(const std::string& kind, const io::Dataset& d, bool train,
                                    bool augment) {
  if (kind == "fashion-mnist") {
    auto t = io::fashion_mnist_transforms(train);
    if (!augment) {
      t.pad = 0;
      t.flip = false;
    }
    return t;
  }
  io::TransformOptions t;
  if (d.encoded()) return t;  // imagefolder / shards: the Loader's ImageTransformOptions apply
  // synthetic: plain scaling
  int c = d.image_shape().c;
  t.mean.assign(c, 0.5f);
  t.std.assign(c, 0.25f);
  return t;
}

io::ImageTransformOptions image_transforms_for(const io::Dataset& d) {
  io::ImageTransformOptions t;
  t.out_size = d.image_shape().h;
  t.resize = int(std::lround(t.out_size * 256.0 / 224.0));
  return t;
}

void check_data_spec(const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon), arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  const bool ok = (kind == "fashion-mnist") || (kind == "synthetic" && colon == std::string::npos) ||
                  ((kind == "imagefolder" || kind == "shards") && !arg.empty());
  SPOTRAIN_CHECK(ok, "unknown --data '", spec, "'; use fashion-mnist[:DIR], imagefolder:DIR, shards:DIR or synthetic");
}

DataPair open_data(const std::string& spec, int64_t train_limit, int64_t test_limit,
                   uint64_t seed, int image_size, bool with_test) {
  DataPair p;
  std::string kind = spec, arg;
  auto colon = spec.find(':');
  if (colon != std::string::npos) {
    kind = spec.substr(0, colon);
    arg = spec.substr(colon + 1);
  }
  if (kind == "fashion-mnist") {
    std::string dir = arg.empty() ? "/usr/share/datasets/fashion-mnist" : arg;
    p.train = io::load_idx_dataset(dir, "train");
    p.test = io::load_idx_dataset(dir, "test");
    const io::ImageShape a = p.train->image_shape(), b = p.test->image_shape();
    SPOTRAIN_CHECK(a.h == b.h && a.w == b.w && a.c == b.c, dir, ": the test images are ", b.h, "x", b.w,
                   ", the training images ", a.h, "x", a.w, ": a model trains and is tested on one size");
  } else if (kind == "imagefolder") {
    SPOTRAIN_CHECK(!arg.empty(), "--data imagefolder:DIR needs a directory (DIR/train/<class>/*.JPEG)");
    p.train = io::open_image_folder(arg + "/train", {}, image_size);
    if (with_test) p.test = io::open_image_folder(arg + "/val", p.train->class_names(), image_size);
  } else if (kind == "shards") {
    SPOTRAIN_CHECK(!arg.empty(), "--data shards:DIR needs a directory written by `spotrain data pack`");
    p.train = io::open_shards(arg + "/train", image_size);
    if (with_test) {
      p.test = io::open_shards(arg + "/val", image_size);
      SPOTRAIN_CHECK(p.train->class_names() == p.test->class_names(), arg, "/train and ", arg,
                     "/val list different classes; pack them from one folder");
    }
  } else if (kind == "synthetic") {
    p.train = io::make_synthetic_dataset(train_limit > 0 ? train_limit : 2048, {28, 28, 1}, 10, seed);
    p.test = io::make_synthetic_dataset(test_limit > 0 ? test_limit : 512, {28, 28, 1}, 10, seed + 1);
  } else {
    check_data_spec(spec);
  }
  p.kind = kind;
  if (train_limit > 0 && train_limit < p.train->size()) p.train = io::take_first(p.train, train_limit);
  if (p.test && test_limit > 0 && test_limit < p.test->size())
    p.test = io::take_first(p.test, test_limit);
  return p;
}

}  // namespace spotrain
