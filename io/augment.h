// Training augmentations applied to the normalized fp32 batch, after the per-sample crop and
// flip: random erasing (torchvision's RandomErasing), and mixup / cutmix over pairs of
// neighbouring samples. Every draw comes from Philox keyed by (seed, epoch, sample id), on
// streams of their own, so pixels and labels depend on neither the thread nor the rank count
// and turning one augmentation on does not move another's draws.
#pragma once
#include <cstdint>

namespace spotrain {
namespace io {

// torchvision.transforms.RandomErasing(p, scale, ratio, value=0), applied to the normalized
// image (so 0 is the data set's mean colour).
struct ErasingOptions {
  float p = 0;  // 0: off
  float scale_min = 0.02f, scale_max = 0.33f;  // erased area as a fraction of the image
  float ratio_min = 0.3f, ratio_max = 3.3f;    // its aspect ratio h/w
};

struct EraseBox {
  bool erase = false;
  int top = 0, left = 0, h = 0, w = 0;
};

// A source of the draws RandomErasing makes, in its order: the p coin, then per try the area
// and log-ratio uniforms and, once a box fits, its top and left integers.
struct ErasingDraws {
  virtual ~ErasingDraws() = default;
  virtual float uniform(float lo, float hi) = 0;  // in [lo, hi), float32 as torch's uniform_
  virtual int below(int n) = 0;                   // in [0, n)
};

// RandomErasing.get_params for an H x W image with draws from `d`: up to 10 tries of area
// fraction U(scale) and aspect exp(U(log ratio)); h = round(sqrt(area * ratio)),
// w = round(sqrt(area / ratio)) (rounding half to even, as Python's round); the first box
// with h < H and w < W is placed at top U{0..H-h}, left U{0..W-w}; else nothing is erased.
EraseBox erasing_box(const ErasingOptions& opt, int height, int width, ErasingDraws& d);

// The box for sample `id` in `epoch` from Philox(seed, stream "erasing").
EraseBox draw_erasing(const ErasingOptions& opt, int height, int width, uint64_t seed, int64_t epoch,
                      int64_t sample_id);

// Sets the box to 0 in an (H, W, C) fp32 image.
void apply_erasing(float* hwc, int height, int width, int channels, const EraseBox& box);

// Mixup (Zhang et al.) and CutMix (Yun et al.) over pairs: samples 2k and 2k+1 of each batch
// (neighbours in the global batch, so on the same rank whatever the rank count) are mixed with
// each other both ways. With both on, each pair picks one with probability switch_prob for
// cutmix. lambda ~ Beta(alpha, alpha); cutmix cuts a box of area (1 - lambda) and then uses the
// box's real area for lambda. Each sample's loss is lambda * CE(own label) + (1 - lambda) *
// CE(partner's label).
struct MixOptions {
  float mixup_alpha = 0, cutmix_alpha = 0;  // 0: off
  float switch_prob = 0.5f;                 // both on: the chance a pair uses cutmix
  bool enabled() const { return mixup_alpha > 0 || cutmix_alpha > 0; }
};

struct PairMix {
  bool cutmix = false;
  double lambda = 1;  // weight of each sample's own label (after the cutmix box is clipped)
  int top = 0, left = 0, h = 0, w = 0;  // cutmix: the box exchanged between the pair
};

// The mix for the pair whose first sample is `first_id` (its dataset index).
PairMix draw_pair_mix(const MixOptions& opt, int height, int width, uint64_t seed, int64_t epoch,
                      int64_t first_id);

// Mixes two (H, W, C) fp32 images with each other in place: mixup a' = l a + (1-l) b,
// b' = l b + (1-l) a; cutmix swaps the box between them.
void apply_pair_mix(float* a, float* b, int height, int width, int channels, const PairMix& m);

// Beta(alpha, alpha) from uniforms (Marsaglia-Tsang gamma variates), for tests.
double sample_beta(double alpha, uint64_t seed, uint64_t stream);

}  // namespace io
}  // namespace spotrain
