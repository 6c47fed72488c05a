// sort_into_classes (see val_labels.h).
#include "io/val_labels.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace spotrain::io {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> read_lines(const std::string& path, const char* what) {
  std::ifstream f(path);
  SPOTRAIN_CHECK(f, "cannot read ", what, " ", path);
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    out.push_back(line);
  }
  return out;
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// A folder or file name that cannot climb out of `dir` or hide.
bool plain_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

std::string stem_of(const std::string& name) { return fs::path(name).stem().string(); }

}  // namespace

SortStats sort_into_classes(const std::string& dir, const std::string& labels,
                            const std::string& synsets, bool dry_run) {
  SPOTRAIN_CHECK(fs::is_directory(dir), dir, " is not a folder (pass the flat validation folder)");
  // The images in the flat folder, by name and by stem (labels may name them without extension).
  std::vector<std::string> flat;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) flat.push_back(e.path().filename().string());
  std::sort(flat.begin(), flat.end());
  std::map<std::string, std::string> by_stem;
  for (const auto& n : flat) by_stem.emplace(stem_of(n), n);

  // name (or stem) -> class
  std::vector<std::pair<std::string, std::string>> wanted;
  const std::vector<std::string> lines = read_lines(labels, "labels file");
  std::vector<std::string> rows;
  for (const auto& l : lines)
    if (l.find_first_not_of(" \t") != std::string::npos) rows.push_back(l);
  SPOTRAIN_CHECK(!rows.empty(), "labels file ", labels, " is empty");
  if (std::all_of(rows.begin(), rows.end(), [](const std::string& r) { return all_digits(r); })) {
    // The devkit's ground truth: class numbers in file-name order.
    SPOTRAIN_CHECK(!synsets.empty(), "labels file ", labels, " holds class numbers (the devkit's "
                   "ground truth): pass --synsets FILE with the class names in number order");
    std::vector<std::string> names;
    for (const auto& l : read_lines(synsets, "--synsets file")) {
      const size_t b = l.find_first_not_of(" \t");
      if (b == std::string::npos) continue;
      names.push_back(l.substr(b, l.find_first_of(" \t,", b) - b));
    }
    // Images already sorted by an earlier run count as the folder's too.
    std::vector<std::string> all = flat;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_directory())
        for (const auto& f : fs::directory_iterator(e.path()))
          if (f.is_regular_file()) all.push_back(f.path().filename().string());
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    SPOTRAIN_CHECK(all.size() == rows.size(), "labels file ", labels, " has ", rows.size(),
                   " class numbers but ", dir, " holds ", all.size(), " images: the numbers go "
                   "with the images in file-name order, so the counts must match");
    for (size_t i = 0; i < rows.size(); ++i) {
      const long k = rows[i].size() > 9 ? 0 : std::stol(rows[i]);
      SPOTRAIN_CHECK(k >= 1 && size_t(k) <= names.size(), "labels file ", labels, " line ", i + 1,
                     ": class number ", k, " is not in 1..", names.size(), " (the lines of the --synsets file ",
                     synsets, ")");
      wanted.emplace_back(all[i], names[size_t(k - 1)]);
    }
  } else {
    for (size_t i = 0; i < rows.size(); ++i) {
      std::string r = rows[i];
      std::replace(r.begin(), r.end(), ',', ' ');
      std::replace(r.begin(), r.end(), '\t', ' ');
      const size_t a = r.find_first_not_of(' ');
      const size_t a_end = r.find(' ', a);
      const size_t b = a_end == std::string::npos ? a_end : r.find_first_not_of(' ', a_end);
      const std::string name = r.substr(a, a_end - a);
      const std::string cls = b == std::string::npos ? "" : r.substr(b, r.find(' ', b) - b);
      if (i == 0 && (name == "ImageId" || name == "filename" || name == "file")) continue;  // a header
      SPOTRAIN_CHECK(!cls.empty(), "labels file ", labels, " line ", i + 1, ": '", rows[i],
                     "' names no class (expected NAME CLASS, or NAME,CLASS ...)");
      wanted.emplace_back(name, cls);
    }
  }

  SortStats st;
  std::set<std::string> classes, listed;
  std::string first_missing;  // named in the error: the last line says what was wrong
  std::vector<std::pair<std::string, std::string>> moves;  // file name -> class
  for (const auto& [name, cls] : wanted) {
    SPOTRAIN_CHECK(plain_name(name) && plain_name(cls), "labels file ", labels, ": '", name, "' -> '",
                   cls, "' is not a plain file and folder name");
    classes.insert(cls);
    std::string file = name;
    if (!fs::exists(fs::path(dir) / file)) {
      auto it = by_stem.find(stem_of(name));
      if (it != by_stem.end()) file = it->second;
    }
    listed.insert(file);
    if (fs::is_regular_file(fs::path(dir) / file)) {
      moves.emplace_back(file, cls);
    } else {
      bool found = fs::is_regular_file(fs::path(dir) / cls / file);
      if (!found)  // sorted by an earlier run, under its extension
        for (const char* ext : {".JPEG", ".jpeg", ".jpg", ".JPG", ".png", ".PNG"})
          if (fs::is_regular_file(fs::path(dir) / cls / (name + ext))) found = true;
      ++(found ? st.already : st.missing);
      if (!found && first_missing.empty()) first_missing = name;
    }
  }
  for (const auto& n : flat)
    if (!listed.count(n)) ++st.unlisted;
  st.classes = int64_t(classes.size());
  SPOTRAIN_CHECK(st.missing == 0, st.missing, " image(s) the labels file ", labels, " names are in neither ",
                 dir, " nor its class folders, the first: ", first_missing,
                 " (an incomplete download, or another set's labels?); nothing was moved");
  if (dry_run) {
    st.moved = int64_t(moves.size());
    return st;
  }
  for (const auto& cls : classes) {
    std::error_code ec;
    fs::create_directories(fs::path(dir) / cls, ec);
    SPOTRAIN_CHECK(!ec, "cannot make ", (fs::path(dir) / cls).string(), ": ", ec.message());
  }
  for (const auto& [file, cls] : moves) {
    std::error_code ec;
    fs::rename(fs::path(dir) / file, fs::path(dir) / cls / file, ec);
    SPOTRAIN_CHECK(!ec, "cannot move ", file, " into ", cls, "/: ", ec.message(), " (", st.moved,
                   " moved so far; run the command again to finish)");
    if (++st.moved % 10000 == 0) log_info(str("sorted ", st.moved, " of ", moves.size(), " images"));
  }
  return st;
}

}  // namespace spotrain::io
