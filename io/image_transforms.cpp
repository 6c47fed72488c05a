// ImageNet transforms (see image_transforms.h): crop-box draws that follow torchvision, and a
// separable two-pass resampler with PIL's bilinear coefficients that also flips and normalizes.
#include "io/image_transforms.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "core/philox.h"

namespace spotrain {
namespace io {
namespace {

// Python's round(): half to even (the default floating-point rounding mode).
int py_round(double v) { return int(std::nearbyint(v)); }

// PIL's precompute_coeffs for one axis with the bilinear (triangle) filter: output i reads
// source pixels [start[i], start[i] + count[i]) with weights w[i * ksize + k].
struct AxisCoeffs {
  int ksize = 0;
  std::vector<int> start, count;
  std::vector<float> w;
};

void axis_coeffs(double in0, double in_size, int lo, int hi, int out, AxisCoeffs* c) {
  const double scale = in_size / out;
  const double fs = std::max(scale, 1.0);
  const double support = fs;  // bilinear support 1.0, widened when shrinking (antialias)
  c->ksize = int(std::ceil(support)) * 2 + 1;
  c->start.assign(size_t(out), 0);
  c->count.assign(size_t(out), 0);
  c->w.assign(size_t(out) * size_t(c->ksize), 0.0f);
  const double ss = 1.0 / fs;
  std::vector<double> tmp(size_t(c->ksize));
  for (int i = 0; i < out; ++i) {
    const double center = in0 + (i + 0.5) * scale;
    int xmin = std::max(int(center - support + 0.5), lo);
    int xmax = std::min(int(center + support + 0.5), hi) - xmin;
    if (xmax < 1) {  // a box at the very edge: read its nearest pixel
      xmin = std::min(std::max(xmin, lo), hi - 1);
      xmax = 1;
    }
    xmax = std::min(xmax, c->ksize);
    double total = 0;
    for (int x = 0; x < xmax; ++x) {
      double t = std::fabs((x + xmin - center + 0.5) * ss);
      double v = t < 1.0 ? 1.0 - t : 0.0;
      tmp[size_t(x)] = v;
      total += v;
    }
    float* w = c->w.data() + size_t(i) * size_t(c->ksize);
    for (int x = 0; x < xmax; ++x) w[x] = float(total != 0.0 ? tmp[size_t(x)] / total : (x == 0 ? 1.0 : 0.0));
    c->start[size_t(i)] = xmin;
    c->count[size_t(i)] = xmax;
  }
}

}  // namespace

CropBox random_resized_crop(int width, int height, const ImageTransformOptions& opt, bool train_flip,
                            uint64_t seed, int64_t epoch, int64_t sample_id) {
  SPOTRAIN_CHECK(width > 0 && height > 0, "random_resized_crop: empty image ", width, "x", height);
  Philox rng(seed, uint32_t(epoch), uint32_t(sample_id), uint32_t(uint64_t(sample_id) >> 32));
  CropBox b;
  b.clip = true;
  b.flip = (rng.uniform() < 0.5f) && train_flip && opt.flip;
  const double area = double(width) * height;
  const double lr0 = std::log(double(opt.ratio_min)), lr1 = std::log(double(opt.ratio_max));
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (opt.scale_min + (opt.scale_max - opt.scale_min) * double(rng.uniform()));
    const double aspect = std::exp(lr0 + (lr1 - lr0) * double(rng.uniform()));
    const int w = py_round(std::sqrt(target * aspect));
    const int h = py_round(std::sqrt(target / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      b.y = rng.below(uint32_t(height - h + 1));
      b.x = rng.below(uint32_t(width - w + 1));
      b.w = w;
      b.h = h;
      return b;
    }
  }
  // Fallback: the whole image, cut to the nearest allowed aspect ratio, centred.
  const double in_ratio = double(width) / height;
  int w = width, h = height;
  if (in_ratio < opt.ratio_min) {
    h = py_round(w / double(opt.ratio_min));
  } else if (in_ratio > opt.ratio_max) {
    w = py_round(h * double(opt.ratio_max));
  }
  b.y = (height - h) / 2;
  b.x = (width - w) / 2;
  b.w = w;
  b.h = h;
  return b;
}

CropBox center_crop_box(int width, int height, const ImageTransformOptions& opt) {
  SPOTRAIN_CHECK(width > 0 && height > 0, "center_crop_box: empty image ", width, "x", height);
  // torchvision Resize(int): shorter side to `resize`, longer side int(resize * long / short).
  int new_w, new_h;
  if (width <= height) {
    new_w = opt.resize;
    new_h = int(int64_t(opt.resize) * height / width);
  } else {
    new_h = opt.resize;
    new_w = int(int64_t(opt.resize) * width / height);
  }
  const int top = py_round((new_h - opt.out_size) / 2.0);
  const int left = py_round((new_w - opt.out_size) / 2.0);
  const double sx = double(width) / new_w, sy = double(height) / new_h;
  CropBox b;
  b.x = left * sx;
  b.y = top * sy;
  b.w = opt.out_size * sx;
  b.h = opt.out_size * sy;
  return b;
}

int pick_jpeg_denom(const CropBox& box, int out_size) {
  for (int d : {8, 4, 2})
    if (box.w / d >= out_size && box.h / d >= out_size) return d;
  return 1;
}

namespace {

typedef float v4f __attribute__((vector_size(16)));  // one pixel, 4 lanes (RGB + unused)

template <int C>
inline v4f load_pixel(const uint8_t* p) {
  if (C == 4) {
    typedef uint8_t v4u8 __attribute__((vector_size(4)));
    v4u8 b;
    std::memcpy(&b, p, 4);
    return __builtin_convertvector(b, v4f);
  }
  v4f v = {float(p[0]), float(p[1]), float(p[2]), 0.0f};
  return v;
}

// Built twice: for AVX2/FMA machines (x86-64-v3, picked at load time) and plain x86-64.
// Out float: normalized; Out uint8_t: the resampled pixel rounded (half up, as PIL) and clamped.
template <int C, typename Out>
__attribute__((target_clones("arch=x86-64-v3", "default"))) void resample_impl(const uint8_t* px, int width, const AxisCoeffs& cx, const AxisCoeffs& cy, bool flip,
                   const ImageTransformOptions& opt, Out* dst, std::vector<float>* scratch) {
  const int out = opt.out_size;
  const int row0 = cy.start.front();
  const int row1 = cy.start.back() + cy.count.back();  // source rows [row0, row1) are read
  const size_t row_floats = size_t(out) * 4;
  scratch->resize(size_t(row1 - row0 + 1) * row_floats + 4);
  // 16-byte aligned start for the v4f rows
  float* base = scratch->data();
  while (reinterpret_cast<uintptr_t>(base) % 16) ++base;
  v4f* tmp = reinterpret_cast<v4f*>(base);             // (row1 - row0, out) pixels
  v4f* acc = tmp + size_t(row1 - row0) * size_t(out);  // (out) pixels
  // Horizontal pass over the rows the vertical pass needs.
  for (int y = row0; y < row1; ++y) {
    const uint8_t* src = px + size_t(y) * size_t(width) * C;
    v4f* t = tmp + size_t(y - row0) * size_t(out);
    for (int x = 0; x < out; ++x) {
      const float* w = cx.w.data() + size_t(x) * size_t(cx.ksize);
      const uint8_t* p = src + size_t(cx.start[size_t(x)]) * C;
      v4f a = {0, 0, 0, 0};
      for (int k = 0, n = cx.count[size_t(x)]; k < n; ++k, p += C) a += w[k] * load_pixel<C>(p);
      t[x] = a;
    }
  }
  // Vertical pass, then mirror and normalize into the output row.
  [[maybe_unused]] const v4f mul = {1.0f / (255.0f * opt.std[0]), 1.0f / (255.0f * opt.std[1]), 1.0f / (255.0f * opt.std[2]), 0};
  [[maybe_unused]] const v4f add = {-opt.mean[0] / opt.std[0], -opt.mean[1] / opt.std[1], -opt.mean[2] / opt.std[2], 0};
  for (int y = 0; y < out; ++y) {
    const float* w = cy.w.data() + size_t(y) * size_t(cy.ksize);
    const int n = cy.count[size_t(y)];
    const v4f* t0 = tmp + size_t(cy.start[size_t(y)] - row0) * size_t(out);
    for (int x = 0; x < out; ++x) {
      v4f a = {0, 0, 0, 0};
      const v4f* t = t0 + x;
      for (int k = 0; k < n; ++k, t += out) a += w[k] * *t;
      acc[x] = a;
    }
    Out* d = dst + size_t(y) * size_t(out) * 3;
    for (int x = 0; x < out; ++x) {
      if constexpr (std::is_same_v<Out, float>) {
        const v4f v = acc[flip ? out - 1 - x : x] * mul + add;
        d[3 * x] = v[0];
        d[3 * x + 1] = v[1];
        d[3 * x + 2] = v[2];
      } else {
        const v4f v = acc[flip ? out - 1 - x : x];
        for (int k = 0; k < 3; ++k)
          d[3 * x + k] = uint8_t(std::floor(double(std::min(255.f, std::max(0.f, v[k]))) + 0.5));
      }
    }
  }
}

template <typename Out>
void resample_to(const uint8_t* px, int width, int height, const CropBox& box,
                 const ImageTransformOptions& opt, Out* dst, std::vector<float>* scratch,
                 int channels) {
  SPOTRAIN_CHECK(channels == 3 || channels == 4, "resample: 3 or 4 channels, got ", channels);
  const int out = opt.out_size;
  // Taps stay inside the image; a training crop is cut out first, as torchvision's
  // crop-then-resize does, so its taps stay inside the box.
  int xlo = 0, xhi = width, ylo = 0, yhi = height;
  if (box.clip) {
    xlo = std::max(0, int(std::floor(box.x)));
    xhi = std::min(width, int(std::ceil(box.x + box.w)));
    ylo = std::max(0, int(std::floor(box.y)));
    yhi = std::min(height, int(std::ceil(box.y + box.h)));
  }
  thread_local AxisCoeffs cx, cy;
  axis_coeffs(box.x, box.w, xlo, xhi, out, &cx);
  axis_coeffs(box.y, box.h, ylo, yhi, out, &cy);
  if (channels == 4)
    resample_impl<4>(px, width, cx, cy, box.flip, opt, dst, scratch);
  else
    resample_impl<3>(px, width, cx, cy, box.flip, opt, dst, scratch);
}

}  // namespace

void resample_normalize(const uint8_t* px, int width, int height, const CropBox& box,
                        const ImageTransformOptions& opt, float* dst, std::vector<float>* scratch,
                        int channels) {
  resample_to(px, width, height, box, opt, dst, scratch, channels);
}

void resample_pixels(const uint8_t* px, int width, int height, const CropBox& box,
                     const ImageTransformOptions& opt, uint8_t* dst, std::vector<float>* scratch,
                     int channels) {
  resample_to(px, width, height, box, opt, dst, scratch, channels);
}

}  // namespace io
}  // namespace spotrain
