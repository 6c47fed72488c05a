// Builds a real JPEG ImageFolder (DIR/train/<class>/*.JPEG, DIR/val/...) from Fashion-MNIST
// images for the image-pipeline tests: tinted RGB JPEGs, some grayscale, one CMYK, plus one
// corrupt and one truncated file in train/, all encoded with libjpeg-turbo.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/dataset.h"
#include "io/jpeg.h"

struct ImageFolderFixture {
  std::string root;
  std::string corrupt, truncated;  // paths of the two bad files in train/
};

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& b, size_t n) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(n));
}

// per_class_train / per_class_val images of each of the 10 classes (taken in file order).
inline ImageFolderFixture make_fashion_image_folder(const std::string& root, int per_class_train,
                                                    int per_class_val) {
  namespace fs = std::filesystem;
  using namespace spotrain;
  fs::remove_all(root);
  auto train = io::load_idx_dataset(io::kDefaultFashionMnistDir, "train");
  const char* names[10] = {"n00_tshirt", "n01_trouser", "n02_pullover", "n03_dress", "n04_coat",
                           "n05_sandal", "n06_shirt",   "n07_sneaker",  "n08_bag",   "n09_boot"};
  ImageFolderFixture fx;
  fx.root = root;
  std::vector<int> count_train(10, 0), count_val(10, 0);
  std::vector<uint8_t> px(28 * 28), rgb(28 * 28 * 3), cmyk(28 * 28 * 4);
  int written = 0;
  for (int64_t i = 0; i < train->size(); ++i) {
    int32_t label = 0;
    train->get(i, px.data(), &label);
    const bool to_train = count_train[size_t(label)] < per_class_train;
    const bool to_val = !to_train && count_val[size_t(label)] < per_class_val;
    if (!to_train && !to_val) continue;
    const std::string split = to_train ? "train" : "val";
    const int k = to_train ? count_train[size_t(label)]++ : count_val[size_t(label)]++;
    const std::string dir = root + "/" + split + "/" + names[label];
    fs::create_directories(dir);
    const std::string path = dir + "/img_" + std::to_string(k) + ".JPEG";
    std::vector<uint8_t> jpg;
    if (written % 5 == 1) {
      jpg = io::encode_jpeg(px.data(), 28, 28, 1, 95);  // grayscale JPEG
    } else if (written == 7) {
      for (int p = 0; p < 28 * 28; ++p) {  // CMYK: ink where the garment is
        cmyk[size_t(4 * p)] = uint8_t(px[size_t(p)] / 2);
        cmyk[size_t(4 * p + 1)] = 0;
        cmyk[size_t(4 * p + 2)] = uint8_t(px[size_t(p)] / 3);
        cmyk[size_t(4 * p + 3)] = uint8_t(px[size_t(p)] / 2);
      }
      jpg = io::encode_jpeg(cmyk.data(), 28, 28, 4, 95);
    } else {
      for (int p = 0; p < 28 * 28; ++p) {  // a tint that depends on the pixel, not the class
        rgb[size_t(3 * p)] = px[size_t(p)];
        rgb[size_t(3 * p + 1)] = uint8_t(px[size_t(p)] * 3 / 4);
        rgb[size_t(3 * p + 2)] = uint8_t(255 - px[size_t(p)] / 2);
      }
      jpg = io::encode_jpeg(rgb.data(), 28, 28, 3, 95);
    }
    write_bytes(path, jpg, jpg.size());
    ++written;
  }
  // The two bad files: random bytes named .JPEG, and a JPEG cut in half.
  fx.corrupt = root + "/train/" + names[3] + "/zz_corrupt.JPEG";
  std::vector<uint8_t> junk(700);
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = uint8_t((i * 2654435761u) >> 13);
  write_bytes(fx.corrupt, junk, junk.size());
  fx.truncated = root + "/train/" + names[6] + "/zz_truncated.JPEG";
  for (int p = 0; p < 28 * 28 * 3; ++p) rgb[size_t(p)] = uint8_t(p * 7);
  auto full = io::encode_jpeg(rgb.data(), 28, 28, 3, 95);
  write_bytes(fx.truncated, full, full.size() / 2);
  return fx;
}
