// Per-sample image transforms: uint8 HWC -> normalized fp32 HWC (one NHWC row of a batch),
// with a random zero-padded crop and horizontal flip for training. The random draws come from
// Philox(seed, epoch, sample id), so pixels do not depend on thread or rank count.
#pragma once
#include <cstdint>
#include <vector>

#include "io/dataset.h"

namespace spotrain {
namespace io {

struct TransformOptions {
  std::vector<float> mean, std;  // per channel (or one value for all), in [0,1] units:
                                 // (x/255 - mean)/std; empty means mean 0, std 1
  int pad = 0;        // random crop with zero padding of `pad` pixels (training only); output same HxW
  bool flip = false;  // random horizontal flip p=0.5 (training only)
};

// Throws Error unless mean/std have 0, 1 or shape.c entries, std > 0 and pad >= 0.
void check_transform_options(const TransformOptions& opt, ImageShape shape);

// Where one training sample's crop window sits and whether it is mirrored:
// out(y, x) = src(y + dy, xs + dx) with xs = flip ? W-1-x : x; src outside the image reads 0.
struct CropFlip {
  int dy = 0, dx = 0;  // in [-pad, pad]
  bool flip = false;
};

// The draw for (seed, epoch, sample_id): Philox(seed, uint32(epoch), uint32(id), uint32(id>>32))
// gives dy, dx, flip in that order (always three draws, so turning flip on does not move crops).
CropFlip draw_crop_flip(const TransformOptions& opt, uint64_t seed, int64_t epoch,
                        int64_t sample_id);

// Applies a given crop/flip, then normalizes; writes shape.numel() floats (HWC) to dst.
void apply_transform(const uint8_t* src, ImageShape shape, const TransformOptions& opt,
                     CropFlip cf, float* dst);

// apply_transform with draw_crop_flip(...) when train is true, the identity crop otherwise.
// Padding pixels are 0 in uint8 space (before normalizing).
void transform_image(const uint8_t* src, ImageShape shape, const TransformOptions& opt, bool train,
                     uint64_t seed, int64_t epoch, int64_t sample_id, float* dst);

// mean 0.2860, std 0.3530; training adds pad 2 and flip.
TransformOptions fashion_mnist_transforms(bool train);

}  // namespace io
}  // namespace spotrain
