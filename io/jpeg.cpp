// JPEG codec (see jpeg.h): thin wrappers over TurboJPEG 2.x with per-thread handles, treating
// libjpeg warnings (truncated data) as errors, and a CMYK -> RGB conversion matching PIL.
#include "io/jpeg.h"

#include <turbojpeg.h>
// libjpeg's API after TurboJPEG's: jpeglib.h needs stdio's FILE and size_t declared first.
#include <cstdio>
#include <jpeglib.h>

#include <csetjmp>
#include <cstring>

#include <algorithm>

#include "core/error.h"

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

namespace {

// libjpeg reports errors through callbacks: jump back out of the library, and treat warnings
// (corrupt or truncated data, which libjpeg would paper over with grey) as errors too.
struct JpegErr {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char msg[JMSG_LENGTH_MAX];
};

void on_error(j_common_ptr c) {
  JpegErr* e = reinterpret_cast<JpegErr*>(c->err);
  (*c->err->format_message)(c, e->msg);
  std::longjmp(e->jump, 1);
}

void on_message(j_common_ptr c, int level) {
  if (level < 0) on_error(c);  // a warning: corrupt data
}

// CMYK as stored (Adobe-inverted) -> RGB as PIL converts it.
void cmyk_row_to_rgb(const uint8_t* in, uint8_t* out, size_t n, int channels) {
  for (size_t i = 0; i < n; ++i, in += 4, out += channels) {
    const unsigned k = in[3];
    for (int c = 0; c < 3; ++c) out[c] = uint8_t((in[c] * k + 127) / 255);
  }
}

}  // namespace

void decode_jpeg_region(const uint8_t* data, size_t size, int denom, bool fast, JpegRegion want,
                        std::vector<uint8_t>* rgb, JpegRegion* got, int channels) {
  SPOTRAIN_CHECK(channels == 3 || channels == 4, "decode_jpeg_region: 3 or 4 channels, got ", channels);
  SPOTRAIN_CHECK(denom == 1 || denom == 2 || denom == 4 || denom == 8,
                 "JPEG scale denominator must be 1, 2, 4 or 8, got ", denom);
  SPOTRAIN_CHECK(size >= 4 && data[0] == 0xFF && data[1] == 0xD8, "not a JPEG file (no SOI marker)");
  // Rows below the region are never read, so check the end of the file is there at all.
  bool eoi = false;
  for (size_t i = size - 1; i > 0 && i + 64 >= size && !eoi; --i) eoi = data[i - 1] == 0xFF && data[i] == 0xD9;
  SPOTRAIN_CHECK(eoi, "truncated JPEG file (no end-of-image marker)");
  jpeg_decompress_struct cinfo;
  JpegErr err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = on_error;
  err.mgr.emit_message = on_message;
  thread_local std::vector<uint8_t> row;  // one CMYK row
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    SPOTRAIN_THROW(err.msg);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, (unsigned long)size);
  jpeg_read_header(&cinfo, TRUE);
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : channels == 4 ? JCS_EXT_RGBX : JCS_RGB;
  cinfo.scale_num = 1;
  cinfo.scale_denom = unsigned(denom);
  cinfo.dct_method = fast ? JDCT_IFAST : JDCT_ISLOW;
  cinfo.do_fancy_upsampling = fast ? FALSE : TRUE;
  jpeg_start_decompress(&cinfo);
  const int W = int(cinfo.output_width), H = int(cinfo.output_height);
  int x0 = std::max(0, std::min(want.x, W - 1)), y0 = std::max(0, std::min(want.y, H - 1));
  int x1 = std::max(x0 + 1, std::min(want.x + want.w, W)), y1 = std::max(y0 + 1, std::min(want.y + want.h, H));
  // Chroma upsampling at a region edge inside the image would see no neighbour there and
  // replicate the edge instead: decode one iMCU more on each side (rounded to iMCU edges),
  // so the pixels asked for are the whole-image decode's.
  const int mcu_w = cinfo.max_h_samp_factor * cinfo.min_DCT_scaled_size;
  const int mcu_h = cinfo.max_v_samp_factor * cinfo.min_DCT_scaled_size;
  x0 = std::max(0, x0 / mcu_w * mcu_w - mcu_w);
  x1 = std::min(W, (x1 + mcu_w - 1) / mcu_w * mcu_w + mcu_w);
  y0 = std::max(0, y0 / mcu_h * mcu_h - mcu_h);
  y1 = std::min(H, (y1 + mcu_h - 1) / mcu_h * mcu_h + mcu_h);
  JDIMENSION xoff = JDIMENSION(x0), cw = JDIMENSION(x1 - x0);
  if (x0 > 0 || x1 < W) jpeg_crop_scanline(&cinfo, &xoff, &cw);  // widens to iMCU edges
  if (y0 > 0) jpeg_skip_scanlines(&cinfo, JDIMENSION(y0));
  const int ow = int(cinfo.output_width), oh = y1 - y0;
  rgb->resize(size_t(ow) * size_t(oh) * size_t(channels));
  if (cmyk) row.resize(size_t(ow) * 4);
  for (int y = 0; y < oh; ++y) {
    uint8_t* dst = rgb->data() + size_t(y) * size_t(ow) * size_t(channels);
    JSAMPROW r = cmyk ? row.data() : dst;
    if (jpeg_read_scanlines(&cinfo, &r, 1) != 1) {
      std::snprintf(err.msg, sizeof err.msg, "JPEG data ended at row %d of %d", y0 + y, H);
      jpeg_destroy_decompress(&cinfo);
      SPOTRAIN_THROW(err.msg);
    }
    if (cmyk) cmyk_row_to_rgb(row.data(), dst, size_t(ow), channels);
  }
  jpeg_destroy_decompress(&cinfo);  // without reading the rest: the rows below are not decoded
  got->x = int(xoff);
  got->y = y0;
  got->w = ow;
  got->h = oh;
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
