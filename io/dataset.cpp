// Datasets (see dataset.h): IDX reader with one-line errors naming the file, deterministic
// synthetic images, and the first-n subset view.
#include "io/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sys/stat.h>
#include <vector>

#include "core/error.h"
#include "core/philox.h"

namespace spotrain {
namespace io {
namespace {

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension

std::string hex32(uint32_t v) {
  char buf[16];
  snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

uint32_t big_endian32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

// A gzip (or, transparently, plain) file opened for reading; closes itself.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    errno = 0;
    f_ = gzopen(path.c_str(), "rb");
    if (!f_)
      SPOTRAIN_THROW("cannot open ", path, ": ", std::strerror(errno ? errno : ENOMEM),
                     "; install dataset-fashion-mnist or pass --data fashion-mnist:DIR");
  }
  ~GzReader() { gzclose(f_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to n bytes; fewer only at the end of the data (a truncated file).
  size_t read(void* dst, size_t n) {
    size_t got = 0;
    while (got < n) {
      unsigned chunk = unsigned(std::min<size_t>(n - got, size_t(1) << 30));
      errno = 0;
      int r = gzread(f_, static_cast<char*>(dst) + got, chunk);
      if (r < 0) {
        int errnum = 0;
        const char* msg = gzerror(f_, &errnum);
        SPOTRAIN_THROW("cannot read ", path_, ": ",
                       errnum == Z_ERRNO ? std::strerror(errno) : str("corrupt gzip data (", msg, ")"));
      }
      if (r == 0) break;  // end of data (or a truncated gzip stream)
      got += size_t(r);
    }
    return got;
  }

 private:
  std::string path_;
  gzFile f_ = nullptr;
};

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// DIR/BASE.gz if present, else DIR/BASE if present, else DIR/BASE.gz (for the error message).
std::string resolve(const std::string& dir, const std::string& base) {
  std::string d = dir.empty() ? std::string(".") : dir;
  if (d.back() != '/') d += '/';
  if (exists(d + base + ".gz")) return d + base + ".gz";
  if (exists(d + base)) return d + base;
  return d + base + ".gz";
}

struct IdxImages {
  int64_t count = 0;
  ImageShape shape;
  std::vector<uint8_t> pixels;  // (count, h, w, 1)
};

// Reads an IDX file's header (`n` bytes into hdr) and checks its magic number; `what` is the
// file's kind as its errors name it ("image", "label").
void read_idx_header(GzReader& f, const std::string& path, unsigned char* hdr, size_t n, uint32_t want,
                     const char* what) {
  const size_t got = f.read(hdr, n);
  SPOTRAIN_CHECK(got == n, path, " is truncated: expected ", n == 8 ? "an " : "a ", n, "-byte IDX ", what,
                 " header, found ", got, " bytes");
  const uint32_t magic = big_endian32(hdr);
  SPOTRAIN_CHECK(magic == want, path, " is not an IDX ", what, " file: magic ", hex32(magic), ", expected ",
                 hex32(want));
}

IdxImages read_idx_images(const std::string& path) {
  GzReader f(path);
  unsigned char hdr[16];
  read_idx_header(f, path, hdr, sizeof hdr, kIdxImagesMagic, "image");
  IdxImages out;
  out.count = big_endian32(hdr + 4);
  uint32_t rows = big_endian32(hdr + 8), cols = big_endian32(hdr + 12);
  SPOTRAIN_CHECK(out.count > 0, path, " holds no images (its header says 0)");
  SPOTRAIN_CHECK(rows > 0 && cols > 0 && rows <= 65536 && cols <= 65536, path,
                 " has an invalid image size ", rows, "x", cols, " in its header");
  out.shape = ImageShape{int(rows), int(cols), 1};
  // Read in chunks so a header that lies about the size cannot make us allocate it all.
  const uint64_t expected = uint64_t(out.count) * rows * cols;
  uint64_t have = 0;
  while (have < expected) {
    size_t chunk = size_t(std::min<uint64_t>(expected - have, uint64_t(64) << 20));
    out.pixels.resize(size_t(have) + chunk);
    size_t r = f.read(out.pixels.data() + have, chunk);
    have += r;
    if (r < chunk) break;
  }
  SPOTRAIN_CHECK(have == expected, path, " is truncated: its header says ", out.count, " images of ",
                 rows, "x", cols, " (", expected, " bytes) but only ", have, " bytes follow");
  return out;
}

std::vector<int32_t> read_idx_labels(const std::string& path, int num_classes) {
  GzReader f(path);
  unsigned char hdr[8];
  read_idx_header(f, path, hdr, sizeof hdr, kIdxLabelsMagic, "label");
  const uint64_t count = big_endian32(hdr + 4);
  SPOTRAIN_CHECK(count > 0, path, " holds no labels (its header says 0)");
  std::vector<uint8_t> raw;
  uint64_t have = 0;
  while (have < count) {
    size_t chunk = size_t(std::min<uint64_t>(count - have, uint64_t(16) << 20));
    raw.resize(size_t(have) + chunk);
    size_t r = f.read(raw.data() + have, chunk);
    have += r;
    if (r < chunk) break;
  }
  SPOTRAIN_CHECK(have == count, path, " is truncated: its header says ", count, " labels but only ",
                 have, " bytes follow");
  std::vector<int32_t> labels(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    SPOTRAIN_CHECK(raw[i] < num_classes, path, ": label ", int(raw[i]), " at index ", i,
                   " is out of range for ", num_classes, " classes");
    labels[i] = raw[i];
  }
  return labels;
}

class IdxDataset final : public Dataset {
 public:
  IdxDataset(std::string name, IdxImages images, std::vector<int32_t> labels, int num_classes)
      : name_(std::move(name)), images_(std::move(images)), labels_(std::move(labels)),
        num_classes_(num_classes) {}
  int64_t size() const override { return images_.count; }
  int num_classes() const override { return num_classes_; }
  ImageShape image_shape() const override { return images_.shape; }
  void get(int64_t index, uint8_t* hwc_out, int32_t* label) const override {
    SPOTRAIN_CHECK(index >= 0 && index < size(), name_, ": sample index ", index,
                   " out of range [0, ", size(), ")");
    const int64_t n = images_.shape.numel();
    std::memcpy(hwc_out, images_.pixels.data() + index * n, size_t(n));
    *label = labels_[size_t(index)];
  }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  IdxImages images_;
  std::vector<int32_t> labels_;
  int num_classes_;
};

// Sample i of a synthetic set: pixels from Philox(seed, i_lo, i_hi, 'IMG'),
// label from Philox(seed, i_lo, i_hi, 'LAB').
constexpr uint32_t kSynthPixels = 0x494D47, kSynthLabel = 0x4C4142;

void synth_sample(uint64_t seed, int64_t index, int64_t numel, int num_classes, uint8_t* out,
                  int32_t* label) {
  Philox px(seed, uint32_t(index), uint32_t(uint64_t(index) >> 32), kSynthPixels);
  int64_t i = 0;
  for (; i + 4 <= numel; i += 4) {
    uint32_t v = px.next_u32();
    std::memcpy(out + i, &v, 4);
  }
  if (i < numel) {
    uint32_t v = px.next_u32();
    std::memcpy(out + i, &v, size_t(numel - i));
  }
  Philox lb(seed, uint32_t(index), uint32_t(uint64_t(index) >> 32), kSynthLabel);
  *label = int32_t(lb.below(uint32_t(num_classes)));
}

class SyntheticDataset final : public Dataset {
 public:
  static constexpr uint64_t kMaxCachedBytes = uint64_t(1) << 30;

  SyntheticDataset(int64_t size, ImageShape shape, int num_classes, uint64_t seed)
      : size_(size), shape_(shape), num_classes_(num_classes), seed_(seed) {
    const int64_t n = shape.numel();
    if (uint64_t(size) * uint64_t(n) <= kMaxCachedBytes) {
      pixels_.resize(size_t(size * n));
      labels_.resize(size_t(size));
      for (int64_t i = 0; i < size; ++i)
        synth_sample(seed_, i, n, num_classes_, pixels_.data() + i * n, &labels_[size_t(i)]);
    }
  }
  int64_t size() const override { return size_; }
  int num_classes() const override { return num_classes_; }
  ImageShape image_shape() const override { return shape_; }
  void get(int64_t index, uint8_t* hwc_out, int32_t* label) const override {
    SPOTRAIN_CHECK(index >= 0 && index < size_, name(), ": sample index ", index,
                   " out of range [0, ", size_, ")");
    const int64_t n = shape_.numel();
    if (pixels_.empty()) {
      synth_sample(seed_, index, n, num_classes_, hwc_out, label);
      return;
    }
    std::memcpy(hwc_out, pixels_.data() + index * n, size_t(n));
    *label = labels_[size_t(index)];
  }
  std::string name() const override {
    return str("synthetic(", size_, " x ", shape_.h, "x", shape_.w, "x", shape_.c, ", ",
               num_classes_, " classes, seed ", seed_, ")");
  }

 private:
  int64_t size_;
  ImageShape shape_;
  int num_classes_;
  uint64_t seed_;
  std::vector<uint8_t> pixels_;  // (size, h, w, c), empty when too large to cache
  std::vector<int32_t> labels_;
};

class FirstN final : public Dataset {
 public:
  FirstN(std::shared_ptr<Dataset> base, int64_t n) : base_(std::move(base)), n_(n) {}
  int64_t size() const override { return n_; }
  int num_classes() const override { return base_->num_classes(); }
  ImageShape image_shape() const override { return base_->image_shape(); }
  void get(int64_t index, uint8_t* hwc_out, int32_t* label) const override {
    SPOTRAIN_CHECK(index >= 0 && index < n_, name(), ": sample index ", index, " out of range [0, ",
                   n_, ")");
    base_->get(index, hwc_out, label);
  }
  std::string name() const override { return str(base_->name(), "[:", n_, "]"); }
  bool encoded() const override { return base_->encoded(); }
  void read_encoded(int64_t index, std::vector<uint8_t>* bytes, int32_t* label) const override {
    SPOTRAIN_CHECK(index >= 0 && index < n_, name(), ": sample index ", index, " out of range [0, ",
                   n_, ")");
    base_->read_encoded(index, bytes, label);
  }
  std::string sample_name(int64_t index) const override { return base_->sample_name(index); }
  std::vector<std::string> class_names() const override { return base_->class_names(); }

 private:
  std::shared_ptr<Dataset> base_;
  int64_t n_;
};

}  // namespace

void Dataset::read_encoded(int64_t index, std::vector<uint8_t>*, int32_t*) const {
  SPOTRAIN_THROW(name(), " holds decoded images; read_encoded(", index, ") is for encoded sources");
}

std::string Dataset::sample_name(int64_t index) const { return str(name(), "[", index, "]"); }

void EncodedDataset::get(int64_t index, uint8_t*, int32_t*) const {
  SPOTRAIN_THROW(name(), " holds encoded images: read them through the Loader (sample ", index, ")");
}

void EncodedDataset::check_index(int64_t index) const {
  SPOTRAIN_CHECK(index >= 0 && index < size(), name(), ": sample index ", index, " out of range");
}

std::shared_ptr<Dataset> load_idx_dataset(const std::string& dir, const std::string& split,
                                          int num_classes) {
  SPOTRAIN_CHECK(split == "train" || split == "test", "unknown IDX split '", split,
                 "' (expected train or test)");
  SPOTRAIN_CHECK(num_classes > 0 && num_classes <= 256, "IDX dataset num_classes must be in [1, 256], got ",
                 num_classes);
  const std::string prefix = split == "train" ? "train" : "t10k";
  const std::string images_path = resolve(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = resolve(dir, prefix + "-labels-idx1-ubyte");
  IdxImages images = read_idx_images(images_path);
  std::vector<int32_t> labels = read_idx_labels(labels_path, num_classes);
  SPOTRAIN_CHECK(int64_t(labels.size()) == images.count, images_path, " holds ", images.count,
                 " images but ", labels_path, " holds ", labels.size(), " labels");
  return std::make_shared<IdxDataset>(str("idx:", dir, ":", split), std::move(images),
                                      std::move(labels), num_classes);
}

std::shared_ptr<Dataset> make_synthetic_dataset(int64_t size, ImageShape shape, int num_classes,
                                                uint64_t seed) {
  SPOTRAIN_CHECK(size > 0, "synthetic dataset size must be positive, got ", size);
  SPOTRAIN_CHECK(shape.h > 0 && shape.w > 0 && shape.c > 0, "synthetic image shape must be positive, got ",
                 shape.h, "x", shape.w, "x", shape.c);
  SPOTRAIN_CHECK(num_classes > 0, "synthetic dataset needs at least one class, got ", num_classes);
  return std::make_shared<SyntheticDataset>(size, shape, num_classes, seed);
}

std::shared_ptr<Dataset> take_first(std::shared_ptr<Dataset> base, int64_t n) {
  SPOTRAIN_CHECK(base, "take_first: no dataset");
  SPOTRAIN_CHECK(n > 0 && n <= base->size(), "take_first: asked for ", n, " samples of ", base->name(),
                 ", which has ", base->size());
  return std::make_shared<FirstN>(std::move(base), n);
}

}  // namespace io
}  // namespace spotrain
