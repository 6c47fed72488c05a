// A test's own scratch folder under the system's temporary folder: emptied and made anew; and
// what temporaries a write left in a folder.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

inline std::filesystem::path fresh_dir(const std::string& name) {
  std::filesystem::path d = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// The files in `dir` that are some write's temporary ("NAME.<...>.tmp", "NAME.tmp"): a write
// that finished, or failed, leaves none.
inline std::vector<std::string> temporaries_in(const std::filesystem::path& dir) {
  std::vector<std::string> left;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".tmp") left.push_back(e.path().filename().string());
  return left;
}
