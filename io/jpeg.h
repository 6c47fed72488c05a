// JPEG decoding and encoding with libjpeg-turbo's TurboJPEG API: header probing, decoding to
// RGB at a reduced size by DCT scaling (1/2, 1/4, 1/8), grayscale and CMYK sources handled.
// Every function is thread-safe (each thread keeps its own TurboJPEG handles).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace spotrain {
namespace io {

struct JpegInfo {
  int width = 0, height = 0;
  int channels = 0;  // in the file: 1 gray, 3 YCbCr/RGB, 4 CMYK/YCCK
};

// Reads the header. Returns false (and an explanation in *why when given) if `data` is not
// a readable JPEG.
bool jpeg_info(const uint8_t* data, size_t size, JpegInfo* info, std::string* why = nullptr);

// Size of the image decoded at 1/denom (denom 1, 2, 4 or 8): ceil(dim / denom).
inline int jpeg_scaled(int dim, int denom) { return (dim + denom - 1) / denom; }

// Decodes to 8-bit RGB (H, W, 3) at 1/denom of full size into *rgb (resized to fit).
// Grayscale is replicated to three channels; CMYK (Adobe-inverted, as Photoshop and libjpeg
// write it) is converted as PIL does: R = C*K/255 on the stored values. Any libjpeg error or
// warning (a truncated or corrupt file) throws spotrain::Error with libjpeg's message.
// `fast` uses the fast integer IDCT and upsampling (slightly different pixels, faster).
void decode_jpeg_rgb(const uint8_t* data, size_t size, int denom, bool fast, std::vector<uint8_t>* rgb,
                     int* width, int* height);

// Region-of-interest decode (libjpeg-turbo's libjpeg API: jpeg_crop_scanline and
// jpeg_skip_scanlines, which TurboJPEG 2.x lacks): decodes at 1/denom only the rows and
// (iMCU-aligned) columns covering [x0, x0 + w) x [y0, y0 + h) of the scaled image, stopping
// after the last needed row. Writes the decoded block (got->h, got->w, 3) and where it lies
// in the scaled image (*got, which covers `want` plus about one iMCU around it). Inside
// `want` the pixels equal decode_jpeg_rgb's; the outermost margin columns may not (chroma
// upsampling has no neighbour there). Same colour handling and errors as decode_jpeg_rgb.
struct JpegRegion {
  int x = 0, y = 0, w = 0, h = 0;  // in the scaled image's pixels
};
// channels 4 writes RGBX (4 bytes a pixel, the 4th unspecified), which SIMD code reads faster.
void decode_jpeg_region(const uint8_t* data, size_t size, int denom, bool fast, JpegRegion want,
                        std::vector<uint8_t>* rgb, JpegRegion* got, int channels = 3);

// Encodes (H, W, channels) 8-bit pixels: channels 1 (grayscale JPEG), 3 (RGB -> YCbCr 4:2:0)
// or 4 (CMYK, stored Adobe-inverted so that decode_jpeg_rgb and PIL read it back).
std::vector<uint8_t> encode_jpeg(const uint8_t* pixels, int width, int height, int channels,
                                 int quality = 90);

}  // namespace io
}  // namespace spotrain
