// Datasets: random-access sources of (uint8 HWC image, label) that the Loader reads from:
// Fashion-MNIST/MNIST IDX files, deterministic synthetic images, a first-n subset view, and
// (io/image_folder.h) encoded JPEG/PNG sources whose bytes the Loader decodes itself.
// Every method is thread-safe, so the Loader's worker threads share one Dataset.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace spotrain {
namespace io {

struct ImageShape {
  int h = 0, w = 0, c = 0;
  int64_t numel() const { return int64_t(h) * w * c; }
};

class Dataset {  // random-access source of (uint8 HWC image, label)
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int num_classes() const = 0;
  virtual ImageShape image_shape() const = 0;
  // Writes image `index` (image_shape().numel() bytes, HWC) and its label. Thread-safe.
  virtual void get(int64_t index, uint8_t* hwc_out, int32_t* label) const = 0;
  virtual std::string name() const = 0;

  // Encoded sources (JPEG ImageFolder, packed shards) hold compressed files of varying size:
  // the Loader reads their bytes with read_encoded() and decodes and transforms them itself;
  // image_shape() is then the transformed output (out_size, out_size, 3).
  virtual bool encoded() const { return false; }
  // The file's bytes and label. Throws Error naming the file when it cannot be read.
  virtual void read_encoded(int64_t index, std::vector<uint8_t>* bytes, int32_t* label) const;
  // What to call sample `index` in messages (a file path where there is one).
  virtual std::string sample_name(int64_t index) const;
  // Class names in label order, where the source has them (an ImageFolder's directories).
  virtual std::vector<std::string> class_names() const { return {}; }
};

// What every encoded source (io/image_folder.h: an ImageFolder, packed shards) is alike in: its
// name, its class names, an output of out_size x out_size x 3, and get() refused (the Loader
// decodes the bytes that read_encoded() gives it).
class EncodedDataset : public Dataset {
 public:
  EncodedDataset(std::string name, int out_size) : name_(std::move(name)), out_size_(out_size) {}
  int num_classes() const override { return int(classes_.size()); }
  ImageShape image_shape() const override { return {out_size_, out_size_, 3}; }
  void get(int64_t index, uint8_t* hwc_out, int32_t* label) const override;
  std::string name() const override { return name_; }
  bool encoded() const final { return true; }
  std::vector<std::string> class_names() const override { return classes_; }

 protected:
  // Throws unless 0 <= index < size().
  void check_index(int64_t index) const;
  std::vector<std::string> classes_;  // in label order

 private:
  std::string name_;
  int out_size_;
};

// Where `--data fashion-mnist` looks when no DIR is given (Debian package dataset-fashion-mnist).
constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Fashion-MNIST / MNIST IDX files, gzip-compressed or plain, read whole into memory.
// split = "train" (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz]) or
// "test" (t10k-...). Throws Error naming the file on any bad input.
std::shared_ptr<Dataset> load_idx_dataset(const std::string& dir, const std::string& split,
                                          int num_classes = 10);

// Random uint8 images and labels uniform in [0, num_classes), a pure function of
// (seed, index): sample i is the same whatever `size` is. Generated once up front (held in
// memory up to 1 GiB; larger sets regenerate each sample on demand, with the same pixels).
std::shared_ptr<Dataset> make_synthetic_dataset(int64_t size, ImageShape shape, int num_classes,
                                                uint64_t seed);

// Subset view: the first n samples of `base` (0 < n <= base->size()).
std::shared_ptr<Dataset> take_first(std::shared_ptr<Dataset> base, int64_t n);

}  // namespace io
}  // namespace spotrain
