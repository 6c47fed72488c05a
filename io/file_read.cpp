// read_file and read_lines (see file_read.h).
#include "io/file_read.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/error.h"

namespace spotrain {
namespace io {

void read_file(const std::string& path, std::vector<uint8_t>* out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) SPOTRAIN_THROW("cannot open ", path, ": ", std::strerror(errno));
  std::fseek(f, 0, SEEK_END);
  long n = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  if (n < 0) {
    std::fclose(f);
    SPOTRAIN_THROW("cannot read ", path, ": ", std::strerror(errno));
  }
  out->resize(size_t(n));
  size_t got = n ? std::fread(out->data(), 1, size_t(n), f) : 0;
  std::fclose(f);
  SPOTRAIN_CHECK(got == size_t(n), "cannot read ", path, ": short read (", got, " of ", n, " bytes)");
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream f(path);
  SPOTRAIN_CHECK(f.good(), "cannot open ", path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(f, line)) lines.push_back(line);
  return lines;
}

}  // namespace io
}  // namespace spotrain
