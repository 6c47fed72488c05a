// How 8-bit image pixels become a network's input, per channel c: (pixel / 255 - mean[c]) /
// std[c], computed as fma(pixel, scale(c), shift(c)) on the host and on a device alike. The
// loader hands out such batches (io::Batch) and Backend::upload_pixels applies it.
#pragma once

namespace spotrain {

struct PixelNorm {
  float mean[3] = {0.f, 0.f, 0.f};  // in [0, 1] units
  float std[3] = {1.f, 1.f, 1.f};
  float scale(int c) const { return 1.f / (255.f * std[c]); }
  float shift(int c) const { return -mean[c] / std[c]; }
};

}  // namespace spotrain
