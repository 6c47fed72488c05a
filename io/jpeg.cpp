// JPEG codec (see jpeg.h): thin wrappers over TurboJPEG 2.x with per-thread handles, treating
// libjpeg warnings (truncated data) as errors, and a CMYK -> RGB conversion matching PIL.
#include "io/jpeg.h"

#include <turbojpeg.h>

#include <cstring>

#include "engine/error.h"

namespace spotrain {
namespace io {
namespace {

struct Handles {  // one pair per thread; TurboJPEG handles are not thread-safe
  tjhandle dec = nullptr, enc = nullptr;
  ~Handles() {
    if (dec) tjDestroy(dec);
    if (enc) tjDestroy(enc);
  }
  tjhandle decoder() {
    if (!dec) dec = tjInitDecompress();
    SPOTRAIN_CHECK(dec, "cannot create a TurboJPEG decompressor: ", tjGetErrorStr2(nullptr));
    return dec;
  }
  tjhandle encoder() {
    if (!enc) enc = tjInitCompress();
    SPOTRAIN_CHECK(enc, "cannot create a TurboJPEG compressor: ", tjGetErrorStr2(nullptr));
    return enc;
  }
};

Handles& handles() {
  thread_local Handles h;
  return h;
}

}  // namespace

bool jpeg_info(const uint8_t* data, size_t size, JpegInfo* info, std::string* why) {
  tjhandle h = handles().decoder();
  int w = 0, ht = 0, subsamp = 0, cs = 0;
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) {
    if (why) *why = "not a JPEG file (no SOI marker)";
    return false;
  }
  if (tjDecompressHeader3(h, const_cast<uint8_t*>(data), (unsigned long)size, &w, &ht, &subsamp, &cs) != 0) {
    if (why) *why = tjGetErrorStr2(h);
    return false;
  }
  info->width = w;
  info->height = ht;
  info->channels = cs == TJCS_GRAY ? 1 : (cs == TJCS_CMYK || cs == TJCS_YCCK) ? 4 : 3;
  return true;
}

void decode_jpeg_rgb(const uint8_t* data, size_t size, int denom, bool fast, std::vector<uint8_t>* rgb,
                     int* width, int* height) {
  SPOTRAIN_CHECK(denom == 1 || denom == 2 || denom == 4 || denom == 8,
                 "JPEG scale denominator must be 1, 2, 4 or 8, got ", denom);
  JpegInfo info;
  std::string why;
  SPOTRAIN_CHECK(jpeg_info(data, size, &info, &why), why);
  tjhandle h = handles().decoder();
  const int w = jpeg_scaled(info.width, denom), ht = jpeg_scaled(info.height, denom);
  const int flags = TJFLAG_STOPONWARNING | (fast ? (TJFLAG_FASTDCT | TJFLAG_FASTUPSAMPLE) : 0);
  rgb->resize(size_t(w) * size_t(ht) * 3);
  if (info.channels != 4) {
    if (tjDecompress2(h, data, (unsigned long)size, rgb->data(), w, 0, ht, TJPF_RGB, flags) != 0)
      SPOTRAIN_THROW(tjGetErrorStr2(h));
  } else {
    // libjpeg cannot convert CMYK to RGB itself: decode CMYK, then convert as PIL does.
    thread_local std::vector<uint8_t> cmyk;
    cmyk.resize(size_t(w) * size_t(ht) * 4);
    if (tjDecompress2(h, data, (unsigned long)size, cmyk.data(), w, 0, ht, TJPF_CMYK, flags) != 0)
      SPOTRAIN_THROW(tjGetErrorStr2(h));
    uint8_t* out = rgb->data();
    const uint8_t* in = cmyk.data();
    for (size_t i = 0, n = size_t(w) * size_t(ht); i < n; ++i, in += 4, out += 3) {
      const unsigned k = in[3];
      for (int c = 0; c < 3; ++c) out[c] = uint8_t((in[c] * k + 127) / 255);
    }
  }
  *width = w;
  *height = ht;
}

std::vector<uint8_t> encode_jpeg(const uint8_t* pixels, int width, int height, int channels,
                                 int quality) {
  SPOTRAIN_CHECK(channels == 1 || channels == 3 || channels == 4,
                 "encode_jpeg: channels must be 1, 3 or 4, got ", channels);
  SPOTRAIN_CHECK(width > 0 && height > 0, "encode_jpeg: empty image ", width, "x", height);
  tjhandle h = handles().encoder();
  std::vector<uint8_t> inverted;
  const uint8_t* src = pixels;
  if (channels == 4) {  // store Adobe-inverted CMYK, as Photoshop does
    inverted.resize(size_t(width) * size_t(height) * 4);
    for (size_t i = 0; i < inverted.size(); ++i) inverted[i] = uint8_t(255 - pixels[i]);
    src = inverted.data();
  }
  const int pf = channels == 1 ? TJPF_GRAY : channels == 3 ? TJPF_RGB : TJPF_CMYK;
  const int samp = channels == 1 ? TJSAMP_GRAY : TJSAMP_420;
  unsigned char* buf = nullptr;
  unsigned long n = 0;
  if (tjCompress2(h, src, width, 0, height, pf, &buf, &n, samp, quality, 0) != 0) {
    if (buf) tjFree(buf);
    SPOTRAIN_THROW("JPEG encoding failed: ", tjGetErrorStr2(h));
  }
  std::vector<uint8_t> out(buf, buf + n);
  tjFree(buf);
  return out;
}

}  // namespace io
}  // namespace spotrain
