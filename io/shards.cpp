// Packed shards (see shards.h). Layout, in the byte order of the machine that packed them
// (little-endian on x86-64 and Arm64, the machines spotrain builds for):
//   shard-NNNNN.bin  "SPOTSHD1" u32 shard u32 0, then records: u32 'SREC' i32 label u32 length
//                    u32 crc32, then `length` bytes of the encoded image
//   index.bin        "SPOTIDX1" u64 count u32 shards u32 classes, then per record
//                    u32 shard u32 length u64 offset (of the bytes) i32 label u32 crc32
//   classes.txt      one class name per line, line i = label i;  files.txt  source path per record
#include "io/shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/atomic_file.h"
#include "core/error.h"
#include "io/file_read.h"

namespace spotrain {
namespace io {
namespace fs = std::filesystem;
namespace {

constexpr char kShardMagic[8] = {'S', 'P', 'O', 'T', 'S', 'H', 'D', '1'};
constexpr char kIndexMagic[8] = {'S', 'P', 'O', 'T', 'I', 'D', 'X', '1'};
constexpr uint32_t kRecordMagic = 0x43455253;  // "SREC"

struct IndexEntry {
  uint32_t shard, length;
  uint64_t offset;
  int32_t label;
  uint32_t crc;
};
static_assert(sizeof(IndexEntry) == 24, "index entries are 24 bytes");

// A read-only memory map of a whole file.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) SPOTRAIN_THROW("cannot open ", path, ": ", std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      SPOTRAIN_THROW("cannot stat ", path, ": ", std::strerror(errno));
    }
    size_ = size_t(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        SPOTRAIN_THROW("cannot memory-map ", path, ": ", std::strerror(errno));
      }
      data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

std::string shard_name(uint32_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "shard-%05u.bin", i);
  return buf;
}

struct ShardIndex {
  std::vector<IndexEntry> entries;
  uint32_t shards = 0, classes = 0;
};

// Whether a record's bytes, and the 16-byte record header before them, lie inside a shard of
// `size` bytes after the shard's own 16-byte header; written so that no sum can wrap.
bool inside(const IndexEntry& e, uint64_t size) {
  return e.offset >= 16 + 16 && e.offset <= size && e.length <= size - e.offset;
}

ShardIndex read_index(const std::string& dir) {
  const std::string path = dir + "/index.bin";
  std::vector<uint8_t> raw;
  read_file(path, &raw);
  SPOTRAIN_CHECK(raw.size() >= 24 && std::memcmp(raw.data(), kIndexMagic, 8) == 0, path,
                 " is not a spotrain shard index (write one with `spotrain data pack`)");
  ShardIndex idx;
  uint64_t count;
  std::memcpy(&count, raw.data() + 8, 8);
  std::memcpy(&idx.shards, raw.data() + 16, 4);
  std::memcpy(&idx.classes, raw.data() + 20, 4);
  // Compared by division: a crafted count times 24 would wrap past 2^64 and pass a product.
  const uint64_t held = (raw.size() - 24) / sizeof(IndexEntry);
  SPOTRAIN_CHECK((raw.size() - 24) % sizeof(IndexEntry) == 0 && count == held, path,
                 " is truncated or corrupt: it says ", count, " records but holds ", raw.size(), " bytes");
  idx.entries.resize(size_t(count));
  if (count) std::memcpy(idx.entries.data(), raw.data() + 24, size_t(count) * sizeof(IndexEntry));
  return idx;
}

class ShardDataset final : public EncodedDataset {
 public:
  ShardDataset(const std::string& dir, int out_size) : EncodedDataset("shards:" + dir, out_size), dir_(dir) {
    ShardIndex idx = read_index(dir);
    entries_ = std::move(idx.entries);
    classes_ = read_lines(dir + "/classes.txt");
    SPOTRAIN_CHECK(classes_.size() == idx.classes, dir, "/classes.txt lists ", classes_.size(),
                   " classes but index.bin says ", idx.classes);
    files_ = read_lines(dir + "/files.txt");
    if (files_.size() != entries_.size()) files_.clear();  // names are for messages only
    for (uint32_t s = 0; s < idx.shards; ++s)
      shards_.push_back(std::make_unique<MappedFile>(dir + "/" + shard_name(s)));
    for (size_t i = 0; i < entries_.size(); ++i) {
      const IndexEntry& e = entries_[i];
      SPOTRAIN_CHECK(e.shard < shards_.size() && inside(e, shards_[e.shard]->size()),
                     dir, "/index.bin: record ", i, " lies outside its shard (shard ", e.shard,
                     " of ", shards_.size(), "); run `spotrain data verify ", dir, "`");
      SPOTRAIN_CHECK(e.label >= 0 && uint32_t(e.label) < idx.classes, dir, "/index.bin: record ", i,
                     " has label ", e.label, " outside [0, ", idx.classes, ")");
    }
  }
  int64_t size() const override { return int64_t(entries_.size()); }
  void read_encoded(int64_t index, std::vector<uint8_t>* bytes, int32_t* label) const override {
    check_index(index);
    const IndexEntry& e = entries_[size_t(index)];
    const uint8_t* p = shards_[e.shard]->data() + e.offset;
    bytes->assign(p, p + e.length);
    *label = e.label;
  }
  std::string sample_name(int64_t index) const override {
    std::string base = str(dir_, "/", index >= 0 && index < size() ? shard_name(entries_[size_t(index)].shard) : "?",
                           " record ", index);
    if (index >= 0 && size_t(index) < files_.size()) base += " (" + files_[size_t(index)] + ")";
    return base;
  }

 private:
  std::string dir_;
  std::vector<IndexEntry> entries_;
  std::vector<std::string> files_;
  std::vector<std::unique_ptr<MappedFile>> shards_;
};

void put32(std::vector<uint8_t>& v, uint32_t x) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(&x);
  v.insert(v.end(), p, p + 4);
}

}  // namespace

std::shared_ptr<Dataset> open_shards(const std::string& dir, int out_size) {
  SPOTRAIN_CHECK(out_size > 0, "image size must be positive, got ", out_size);
  return std::make_shared<ShardDataset>(dir, out_size);
}

PackStats pack_shards(const Dataset& src, const std::string& out_dir, int64_t shard_bytes) {
  SPOTRAIN_CHECK(src.encoded(), "data pack: ", src.name(), " is not an encoded image set");
  SPOTRAIN_CHECK(shard_bytes > 0, "--shard-size must be positive");
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  SPOTRAIN_CHECK(!ec, "cannot create ", out_dir, ": ", ec.message());
  PackStats st;
  std::vector<IndexEntry> entries;
  std::vector<std::string> names;
  FILE* shard = nullptr;
  uint64_t offset = 0;
  auto close_shard = [&] {
    if (!shard) return;
    bool ok = std::fflush(shard) == 0 && ::fsync(fileno(shard)) == 0;
    ok = (std::fclose(shard) == 0) && ok;
    shard = nullptr;
    SPOTRAIN_CHECK(ok, "cannot write shard ", st.shards - 1, " in ", out_dir, ": ", std::strerror(errno));
  };
  auto open_shard = [&] {
    close_shard();
    const std::string p = out_dir + "/" + shard_name(uint32_t(st.shards));
    shard = std::fopen(p.c_str(), "wb");
    SPOTRAIN_CHECK(shard, "cannot write ", p, ": ", std::strerror(errno));
    std::vector<uint8_t> hdr(kShardMagic, kShardMagic + 8);
    put32(hdr, uint32_t(st.shards));
    put32(hdr, 0);
    SPOTRAIN_CHECK(std::fwrite(hdr.data(), 1, hdr.size(), shard) == hdr.size(), "cannot write ", p);
    offset = hdr.size();
    ++st.shards;
  };
  std::vector<uint8_t> bytes;
  for (int64_t i = 0; i < src.size(); ++i) {
    int32_t label = -1;
    src.read_encoded(i, &bytes, &label);
    SPOTRAIN_CHECK(bytes.size() < (uint64_t(1) << 32), src.sample_name(i), " is larger than 4 GiB");
    if (!shard || (offset > 16 && int64_t(offset + 16 + bytes.size()) > shard_bytes)) open_shard();
    const uint32_t crc = uint32_t(crc32(0L, bytes.data(), uInt(bytes.size())));
    std::vector<uint8_t> hdr;
    put32(hdr, kRecordMagic);
    put32(hdr, uint32_t(label));
    put32(hdr, uint32_t(bytes.size()));
    put32(hdr, crc);
    SPOTRAIN_CHECK(std::fwrite(hdr.data(), 1, 16, shard) == 16 &&
                       std::fwrite(bytes.data(), 1, bytes.size(), shard) == bytes.size(),
                   "cannot write shard ", st.shards - 1, " in ", out_dir, ": ", std::strerror(errno));
    entries.push_back(IndexEntry{uint32_t(st.shards - 1), uint32_t(bytes.size()), offset + 16, label, crc});
    names.push_back(src.sample_name(i));
    offset += 16 + bytes.size();
    st.bytes += int64_t(bytes.size());
  }
  close_shard();
  st.records = int64_t(entries.size());
  std::string classes, files;
  for (auto& c : src.class_names()) classes += c + "\n";
  for (auto& n : names) files += n + "\n";
  write_file_atomic(out_dir + "/classes.txt", classes, "the class list");
  write_file_atomic(out_dir + "/files.txt", files, "the file list");
  // The index last, under a temporary name, so a half-written pack never looks complete.
  std::vector<uint8_t> hdr(kIndexMagic, kIndexMagic + 8);
  const uint64_t count = entries.size();
  hdr.insert(hdr.end(), reinterpret_cast<const uint8_t*>(&count), reinterpret_cast<const uint8_t*>(&count) + 8);
  put32(hdr, uint32_t(st.shards));
  put32(hdr, uint32_t(src.num_classes()));
  std::string index(hdr.begin(), hdr.end());
  index.append(reinterpret_cast<const char*>(entries.data()), entries.size() * sizeof(IndexEntry));
  write_file_atomic(out_dir + "/index.bin", index, "the shard index");
  return st;
}

std::vector<std::string> verify_shards(const std::string& dir, std::vector<std::string>* notes) {
  std::vector<std::string> problems;
  ShardIndex idx;
  try {
    idx = read_index(dir);
  } catch (const Error& e) {
    return {e.what()};
  }
  std::vector<std::string> classes;
  try {
    classes = read_lines(dir + "/classes.txt");
    if (classes.size() != idx.classes)
      problems.push_back(str(dir, "/classes.txt lists ", classes.size(), " classes; index.bin says ", idx.classes));
  } catch (const Error& e) {
    problems.push_back(e.what());
  }
  std::vector<std::unique_ptr<MappedFile>> shards;
  for (uint32_t s = 0; s < idx.shards; ++s) {
    try {
      shards.push_back(std::make_unique<MappedFile>(dir + "/" + shard_name(s)));
      const MappedFile& m = *shards.back();
      uint32_t no = ~0u;
      if (m.size() >= 16) std::memcpy(&no, m.data() + 8, 4);
      if (m.size() < 16 || std::memcmp(m.data(), kShardMagic, 8) != 0 || no != s)
        problems.push_back(str(m.path(), ": not shard ", s, " of this set (bad header)"));
    } catch (const Error& e) {
      problems.push_back(e.what());
      shards.push_back(nullptr);
    }
  }
  for (size_t i = 0; i < idx.entries.size() && problems.size() < 100; ++i) {
    const IndexEntry& e = idx.entries[i];
    if (e.shard >= shards.size() || !shards[e.shard]) {
      if (e.shard >= shards.size())
        problems.push_back(str("index.bin: record ", i, ": shard ", e.shard, " does not exist (the index lists ",
                               shards.size(), ")"));
      continue;
    }
    const MappedFile& m = *shards[e.shard];
    if (!inside(e, m.size())) {
      problems.push_back(str("index.bin: record ", i, ": bytes [", e.offset, ", ", e.offset + e.length,
                             ") lie outside ", m.path(), " (", m.size(), " bytes; truncated?)"));
      continue;
    }
    uint32_t h[4];
    std::memcpy(h, m.data() + e.offset - 16, 16);
    if (h[0] != kRecordMagic || int32_t(h[1]) != e.label || h[2] != e.length || h[3] != e.crc)
      problems.push_back(str("record ", i, " in ", m.path(), ": header does not match the index"));
    const uint8_t* p = m.data() + e.offset;
    if (uint32_t(crc32(0L, p, uInt(e.length))) != e.crc)
      problems.push_back(str("record ", i, " in ", m.path(), ": CRC-32 mismatch (corrupt bytes)"));
    const bool jpeg = e.length >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF;
    const bool png = e.length >= 8 && std::memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0;
    if (!jpeg && !png && notes) notes->push_back(str("record ", i, " in ", m.path(), ": not a JPEG or PNG image"));
    if (e.label < 0 || uint32_t(e.label) >= idx.classes)
      problems.push_back(str("index.bin: record ", i, ": label ", e.label, " outside [0, ", idx.classes, ")"));
  }
  return problems;
}

int64_t parse_bytes(const std::string& s) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    SPOTRAIN_THROW("cannot read size '", s, "'; use e.g. 1GiB, 512MiB, 100MB");
  }
  std::string unit = s.substr(pos);
  for (auto& ch : unit) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  static const std::map<std::string, double> mult{
      {"", 1}, {"b", 1}, {"k", 1024}, {"kib", 1024}, {"kb", 1e3}, {"m", 1 << 20}, {"mib", 1 << 20},
      {"mb", 1e6}, {"g", double(1 << 30)}, {"gib", double(1 << 30)}, {"gb", 1e9}};
  auto it = mult.find(unit);
  SPOTRAIN_CHECK(it != mult.end() && v > 0, "cannot read size '", s, "'; use e.g. 1GiB, 512MiB, 100MB");
  return int64_t(v * it->second);
}

}  // namespace io
}  // namespace spotrain
