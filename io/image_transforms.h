// ImageNet-style transforms for decoded images of any size: RandomResizedCrop + flip for
// training, resize-shorter-side + center crop for evaluation, both ending in one antialiased
// bilinear resample (as PIL's) straight into a normalized fp32 HWC batch row, or into 8-bit
// pixels for the device to normalize.
#pragma once
#include <cstdint>
#include <vector>

namespace spotrain {
namespace io {

struct ImageTransformOptions {
  int out_size = 224;                     // square output (training crop and eval crop)
  int resize = 256;                       // eval: shorter side resized to this, then center crop
  float scale_min = 0.08f, scale_max = 1.0f;         // RandomResizedCrop area fraction
  float ratio_min = 3.0f / 4.0f, ratio_max = 4.0f / 3.0f;  // and aspect ratio (w/h)
  bool flip = true;                       // training: horizontal flip with p = 0.5
  float mean[3] = {0.485f, 0.456f, 0.406f};  // ImageNet, in [0,1] units: (x/255 - mean)/std
  float std[3] = {0.229f, 0.224f, 0.225f};
  bool fast_decode = false;               // fast IDCT / upsampling in the JPEG decoder
};

// A crop of the source image in source pixels (x, y of the top-left corner; w, h its size;
// fractional for evaluation), and whether the output is mirrored.
// clip: the filter's taps stay inside the box (a crop, then a resize: RandomResizedCrop);
// otherwise they reach outside it up to the image edge (a resize, then a crop: eval).
struct CropBox {
  double x = 0, y = 0, w = 0, h = 0;
  bool flip = false;
  bool clip = false;
};

// torchvision's RandomResizedCrop.get_params with its 10 tries and center-crop fallback, and
// the flip coin, all drawn from Philox(seed, uint32(epoch), uint32(id), uint32(id >> 32)):
// flip first, then per try area fraction, log-ratio, top, left.
CropBox random_resized_crop(int width, int height, const ImageTransformOptions& opt, bool train_flip,
                            uint64_t seed, int64_t epoch, int64_t sample_id);

// Evaluation: the box that Resize(resize) then CenterCrop(out_size) would keep, in source
// pixels (torchvision's sizes and rounding), so one resample gives the same filter taps.
CropBox center_crop_box(int width, int height, const ImageTransformOptions& opt);

// DCT scale denominator (1, 2, 4 or 8) for decoding: the largest that still leaves the crop
// at least out_size pixels on both sides.
int pick_jpeg_denom(const CropBox& box, int out_size);

// Resamples `box` of the (H, W, channels) uint8 image (channels 3: RGB, 4: RGBX, the 4th
// ignored) to out_size x out_size with PIL's bilinear filter (triangle, support scaled when
// shrinking), mirrors when box.flip, normalizes, and writes (out_size, out_size, 3) floats.
// `scratch` is reused between calls.
void resample_normalize(const uint8_t* pixels, int width, int height, const CropBox& box,
                        const ImageTransformOptions& opt, float* dst, std::vector<float>* scratch,
                        int channels = 3);
// The same resample without the normalization: (out_size, out_size, 3) bytes, each rounded
// half up and clamped to [0, 255] (the GPU normalizes them: Backend::upload_pixels).
void resample_pixels(const uint8_t* pixels, int width, int height, const CropBox& box,
                     const ImageTransformOptions& opt, uint8_t* dst, std::vector<float>* scratch,
                     int channels = 3);

}  // namespace io
}  // namespace spotrain
