// PNG decoding (and encoding, for tests) with libpng's simplified API, for ImageFolders that
// hold some PNG files among their JPEGs: 8-bit RGBX out, alpha dropped as PIL's convert("RGB").
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace spotrain {
namespace io {

// Whether `data` starts with the PNG signature.
bool is_png(const uint8_t* data, size_t size);

// Decodes to (H, W, 4) 8-bit RGBX (the 4th byte is the alpha, to be ignored). Palette, gray
// and 16-bit files are converted by libpng. Throws Error with libpng's message on bad data.
void decode_png_rgbx(const uint8_t* data, size_t size, std::vector<uint8_t>* rgbx, int* width, int* height);

// Encodes (H, W, channels) 8-bit pixels (1 gray, 3 RGB, 4 RGBA) as PNG.
std::vector<uint8_t> encode_png(const uint8_t* pixels, int width, int height, int channels);

}  // namespace io
}  // namespace spotrain
