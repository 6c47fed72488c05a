// ImageFolder (see image_folder.h): the files of DIR/<class>/, decoded by the Loader.
#include "io/image_folder.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "io/file_read.h"

namespace spotrain {
namespace io {
namespace fs = std::filesystem;
namespace {

bool image_extension(const fs::path& p) {
  std::string e = p.extension().string();
  for (auto& ch : e) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return e == ".jpg" || e == ".jpeg" || e == ".png";
}

class ImageFolder final : public EncodedDataset {
 public:
  ImageFolder(const std::string& dir, std::vector<std::string> classes, std::vector<std::string> files,
              std::vector<int32_t> labels, int out_size)
      : EncodedDataset("imagefolder:" + dir, out_size), files_(std::move(files)), labels_(std::move(labels)) {
    classes_ = std::move(classes);
  }
  int64_t size() const override { return int64_t(files_.size()); }
  void read_encoded(int64_t index, std::vector<uint8_t>* bytes, int32_t* label) const override {
    check_index(index);
    read_file(files_[size_t(index)], bytes);
    *label = labels_[size_t(index)];
  }
  std::string sample_name(int64_t index) const override {
    return index >= 0 && index < size() ? files_[size_t(index)] : Dataset::sample_name(index);
  }

 private:
  std::vector<std::string> files_;
  std::vector<int32_t> labels_;
};

}  // namespace

std::shared_ptr<Dataset> open_image_folder(const std::string& dir, const std::vector<std::string>& classes,
                                           int out_size) {
  SPOTRAIN_CHECK(out_size > 0, "image size must be positive, got ", out_size);
  std::error_code ec;
  SPOTRAIN_CHECK(fs::is_directory(dir, ec), "image folder ", dir,
                 " is not a directory (expected DIR/<class>/*.JPEG)");
  std::vector<std::string> own;
  for (auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && !n.empty() && n[0] != '.') own.push_back(n);
  }
  std::sort(own.begin(), own.end());
  SPOTRAIN_CHECK(!own.empty(), "image folder ", dir, " has no class directories (expected DIR/<class>/*.JPEG)");
  std::vector<std::string> names = classes.empty() ? own : classes;
  std::map<std::string, int32_t> label_of;
  for (size_t i = 0; i < names.size(); ++i) label_of[names[i]] = int32_t(i);
  std::vector<std::string> files;
  std::vector<int32_t> labels;
  for (const auto& c : own) {
    auto it = label_of.find(c);
    SPOTRAIN_CHECK(it != label_of.end(), "image folder ", dir, " has class directory '", c,
                   "', which the training split does not have");
    std::vector<std::string> in_class;
    for (auto& e : fs::directory_iterator(fs::path(dir) / c)) {
      const std::string n = e.path().filename().string();
      if (!n.empty() && n[0] != '.' && !e.is_directory() && image_extension(e.path()))
        in_class.push_back(e.path().string());
    }
    std::sort(in_class.begin(), in_class.end());
    for (auto& f : in_class) {
      files.push_back(std::move(f));
      labels.push_back(it->second);
    }
  }
  SPOTRAIN_CHECK(!files.empty(), "image folder ", dir, " holds no .jpg/.jpeg/.png files in its class directories");
  return std::make_shared<ImageFolder>(dir, std::move(names), std::move(files), std::move(labels), out_size);
}

}  // namespace io
}  // namespace spotrain
