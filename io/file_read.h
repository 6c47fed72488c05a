// Whole-file reads for io/ (internal): a file's bytes and its lines, with errors that name
// the file. Used by the image folder (each image) and the shard reader (index, classes).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace spotrain {
namespace io {

// The bytes of `path`; throws Error naming the file when it cannot be read whole.
void read_file(const std::string& path, std::vector<uint8_t>* out);
// The lines of a text file; throws Error when it cannot be opened.
std::vector<std::string> read_lines(const std::string& path);

}  // namespace io
}  // namespace spotrain
