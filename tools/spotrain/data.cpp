// `spotrain data pack SRC OUT` (an image folder into CRC-checked shards),
// `spotrain data verify OUT` and `spotrain data sort-val DIR LABELS` (ImageNet's flat
// validation folder into class folders).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "io/image_folder.h"
#include "io/shards.h"
#include "io/val_labels.h"
#include "tools/spotrain/commands.h"

namespace spotrain::cli {

namespace {

struct DataOptions {
  std::string pack_src, pack_out, shard_size = "1GiB";
  std::string val_dir, labels, synsets;
};

// `spotrain data sort-val DIR LABELS`; with `dry_run` (--dry-run) it only says what it would do.
int run_data_sort_val(const DataOptions& o, bool dry_run) {
  const auto st = spotrain::io::sort_into_classes(o.val_dir, o.labels, o.synsets, dry_run);
  std::printf("%s: %s %lld image(s) into %lld class folder(s); %lld already sorted\n", o.val_dir.c_str(),
              dry_run ? "would move" : "moved", (long long)st.moved, (long long)st.classes,
              (long long)st.already);
  if (st.unlisted)
    std::fprintf(stderr, "%s: warning: %lld image(s) the labels file %s does not name stay in place "
                 "(the image-folder reader ignores files outside class folders)\n",
                 o.val_dir.c_str(), (long long)st.unlisted, o.labels.c_str());
  return 0;
}

// `spotrain data pack SRC OUT`: each split folder SRC/train, SRC/val -> OUT/train, OUT/val.
int run_data_pack(const std::string& src, const std::string& out, const std::string& shard_size) {
  namespace fs = std::filesystem;
  const int64_t shard_bytes = spotrain::io::parse_bytes(shard_size);
  SPOTRAIN_CHECK(fs::is_directory(src + "/train") || fs::is_directory(src + "/val"), src,
                 " has neither train/ nor val/ (expected SRC/train/<class>/*.JPEG)");
  std::vector<std::string> classes;
  for (const char* split : {"train", "val"}) {
    const std::string dir = src + "/" + split;
    if (!fs::is_directory(dir)) continue;
    auto folder = spotrain::io::open_image_folder(dir, classes);
    if (classes.empty()) classes = folder->class_names();
    auto st = spotrain::io::pack_shards(*folder, out + "/" + split, shard_bytes);
    spotrain::log_info(spotrain::str("packed ", dir, ": ", st.records, " images, ", folder->num_classes(),
                                     " classes, ", spotrain::fmt_fixed(double(st.bytes) / (1 << 20), 1),
                                     " MiB in ", st.shards, " shard(s) -> ", out, "/", split));
  }
  return 0;
}

// `spotrain data verify OUT`: every split under OUT (or OUT itself).
int run_data_verify(const std::string& out) {
  namespace fs = std::filesystem;
  std::vector<std::string> dirs;
  if (fs::exists(out + "/index.bin")) dirs.push_back(out);
  for (const char* split : {"train", "val"})
    if (fs::is_directory(out + "/" + split)) dirs.push_back(out + "/" + split);
  SPOTRAIN_CHECK(!dirs.empty(), out, " holds no packed shards (index.bin, train/ or val/)");
  size_t problems = 0;
  std::string first;  // the last line (what a log's tail shows) names the first problem
  for (auto& d : dirs) {
    std::vector<std::string> notes;
    auto p = spotrain::io::verify_shards(d, &notes);
    for (auto& line : notes) std::fprintf(stderr, "%s: note: %s (the loader will skip it)\n", d.c_str(), line.c_str());
    for (auto& line : p) std::fprintf(stderr, "%s: %s\n", d.c_str(), line.c_str());
    if (p.empty()) std::printf("%s: OK\n", d.c_str());
    if (first.empty() && !p.empty()) first = d + ": " + p.front();
    problems += p.size();
  }
  // (verify_shards stops counting a split's records after kMaxVerifyProblems problems)
  SPOTRAIN_CHECK(problems == 0, first,
                 problems > 1 ? spotrain::str(" (and ", problems - 1, " more problem(s) above)") : std::string(),
                 "; re-pack ", out, " with `spotrain data pack`");
  return 0;
}

}  // namespace

std::vector<Command> add_data(CLI::App& app) {
  auto o = std::make_shared<DataOptions>();
  std::string& pack_src = o->pack_src;
  std::string& pack_out = o->pack_out;
  std::string& shard_size = o->shard_size;
  auto* data_cmd = app.add_subcommand("data", "pack an image folder into shards, verify shards, or sort a flat validation folder into classes");
  data_cmd->require_subcommand(1);
  auto* data_pack = data_cmd->add_subcommand("pack", "SRC/{train,val}/<class>/*.JPEG -> OUT/{train,val} shards");
  data_pack->add_option("src", pack_src, "image folder root (with train/ and/or val/)")->required();
  data_pack->add_option("out", pack_out, "output directory")->required();
  data_pack->add_option("--shard-size", shard_size, "bytes per shard file, e.g. 1GiB, 256MiB")
      ->capture_default_str();
  auto* data_verify = data_cmd->add_subcommand("verify", "check shard headers, lengths and CRC-32s");
  data_verify->add_option("out", pack_out, "directory written by data pack")->required();
  auto* sort_val = data_cmd->add_subcommand(
      "sort-val", "move a flat validation folder's images into DIR/<class>/ by a labels file "
      "(ImageNet's LOC_val_solution.csv, NAME CLASS lines, or the devkit's ground truth with --synsets)");
  sort_val->add_option("dir", o->val_dir, "the flat folder of validation images")->required();
  sort_val->add_option("labels", o->labels, "labels file")->required();
  sort_val->add_option("--synsets", o->synsets,
                       "with the devkit's numbered ground truth: the class names (wnids), one per line in number order");
  return {{data_pack, [o] { return run_data_pack(o->pack_src, o->pack_out, o->shard_size); }},
          {data_verify, [o] { return run_data_verify(o->pack_out); }},
          {sort_val, [o] { return run_data_sort_val(*o, false); }, [o] { return run_data_sort_val(*o, true); }}};
}

}  // namespace spotrain::cli
