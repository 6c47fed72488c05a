// PNG codec (see png.h) over libpng's simplified png_image API.
#include "io/png.h"

#include <png.h>

#include <cstring>

#include "core/error.h"

namespace spotrain {
namespace io {

bool is_png(const uint8_t* data, size_t size) {
  return size >= 8 && std::memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0;
}

void decode_png_rgbx(const uint8_t* data, size_t size, std::vector<uint8_t>* rgbx, int* width, int* height) {
  SPOTRAIN_CHECK(is_png(data, size), "not a PNG file (no PNG signature)");
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&img, data, size)) SPOTRAIN_THROW("PNG: ", img.message);
  img.format = PNG_FORMAT_RGBA;
  SPOTRAIN_CHECK(img.width > 0 && img.height > 0 && uint64_t(img.width) * img.height <= (uint64_t(1) << 28), "PNG: bad size ",
                 img.width, "x", img.height);
  rgbx->resize(PNG_IMAGE_SIZE(img));
  if (!png_image_finish_read(&img, nullptr, rgbx->data(), 0, nullptr)) {
    std::string msg = img.message;
    png_image_free(&img);
    SPOTRAIN_THROW("PNG: ", msg);
  }
  *width = int(img.width);
  *height = int(img.height);
}

std::vector<uint8_t> encode_png(const uint8_t* pixels, int width, int height, int channels) {
  SPOTRAIN_CHECK(channels == 1 || channels == 3 || channels == 4, "encode_png: channels must be 1, 3 or 4");
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = png_uint_32(width);
  img.height = png_uint_32(height);
  img.format = channels == 1 ? PNG_FORMAT_GRAY : channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_RGBA;
  png_alloc_size_t n = 0;
  SPOTRAIN_CHECK(png_image_write_to_memory(&img, nullptr, &n, 0, pixels, 0, nullptr), "PNG: ", img.message);
  std::vector<uint8_t> out(n);
  SPOTRAIN_CHECK(png_image_write_to_memory(&img, out.data(), &n, 0, pixels, 0, nullptr), "PNG: ", img.message);
  out.resize(n);
  return out;
}

}  // namespace io
}  // namespace spotrain
