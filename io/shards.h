// Packed shards: one split's encoded images in large files of label + image bytes with an
// index, memory-mapped when read (no small-file reads from network storage), and the
// `spotrain data pack` / `data verify` behind them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/dataset.h"

namespace spotrain {
namespace io {

// Packed shards of one split, as written by pack_shards: OUT/index.bin, OUT/classes.txt,
// OUT/files.txt and OUT/shard-NNNNN.bin, memory-mapped. Sample i is the folder's sample i.
std::shared_ptr<Dataset> open_shards(const std::string& dir, int out_size = 224);

struct PackStats {
  int64_t records = 0, shards = 0, bytes = 0;
};
// Writes every sample of `src` (an encoded dataset, in order) to shard files of about
// `shard_bytes` each in `out_dir` (created), then the index. Records keep their bytes as they
// are (no re-encoding); each carries a CRC-32.
PackStats pack_shards(const Dataset& src, const std::string& out_dir, int64_t shard_bytes);

// Checks the index against the shards: every record's header, length and CRC-32. Returns
// the problems found, one line each (empty: OK). Records whose bytes do not start like a
// JPEG or PNG (packed as they were; the loader will skip them) are listed in *notes.
std::vector<std::string> verify_shards(const std::string& dir, std::vector<std::string>* notes = nullptr);

// "1GiB", "512MiB", "100MB", "4096" -> bytes; throws Error otherwise.
int64_t parse_bytes(const std::string& s);

}  // namespace io
}  // namespace spotrain
