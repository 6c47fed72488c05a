// A test's own scratch folder under the system's temporary folder: emptied and made anew.
#pragma once
#include <filesystem>
#include <string>

inline std::filesystem::path fresh_dir(const std::string& name) {
  std::filesystem::path d = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}
