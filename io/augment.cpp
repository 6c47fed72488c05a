// Random erasing, mixup and cutmix (see augment.h).
#include "io/augment.h"

#include <algorithm>
#include <cmath>

#include "core/philox.h"

namespace spotrain {
namespace io {

namespace {

// Each augmentation draws from its own Philox key, so none moves another's draws (the crop
// and flip use the seed itself).
constexpr uint64_t kErasingStream = 1, kMixStream = 2;
uint64_t stream_key(uint64_t seed, uint64_t stream) { return seed + 0x9E3779B97F4A7C15ull * stream; }

Philox sample_rng(uint64_t seed, uint64_t stream, int64_t epoch, int64_t id) {
  return Philox(stream_key(seed, stream), uint32_t(epoch), uint32_t(id), uint32_t(uint64_t(id) >> 32));
}

struct PhiloxDraws : ErasingDraws {
  explicit PhiloxDraws(Philox r) : rng(r) {}
  float uniform(float lo, float hi) override { return lo + (hi - lo) * rng.uniform(); }
  int below(int n) override { return int(rng.below(uint32_t(n))); }
  Philox rng;
};

// Gamma(alpha, 1) by Marsaglia and Tsang; alpha < 1 through Gamma(alpha + 1) * U^(1/alpha).
double sample_gamma(double alpha, Philox& rng) {
  double boost = 1;
  if (alpha < 1) {
    double u = std::max(1e-12, double(rng.uniform()));
    boost = std::pow(u, 1.0 / alpha);
    alpha += 1;
  }
  const double d = alpha - 1.0 / 3.0, c = 1.0 / std::sqrt(9 * d);
  for (;;) {
    double x, v;
    do {
      x = double(rng.normal());
      v = 1 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = std::max(1e-12, double(rng.uniform()));
    if (u < 1 - 0.0331 * x * x * x * x || std::log(u) < 0.5 * x * x + d * (1 - v + std::log(v)))
      return d * v * boost;
  }
}

double beta_from(double alpha, Philox& rng) {
  const double x = sample_gamma(alpha, rng), y = sample_gamma(alpha, rng);
  return x + y > 0 ? x / (x + y) : 0.5;
}

}  // namespace

EraseBox erasing_box(const ErasingOptions& opt, int height, int width, ErasingDraws& d) {
  EraseBox box;
  if (!(d.uniform(0.f, 1.f) < opt.p)) return box;  // torch.rand(1) < p
  const double area = double(height) * double(width);
  const float log_lo = std::log(opt.ratio_min), log_hi = std::log(opt.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double erase_area = area * double(d.uniform(opt.scale_min, opt.scale_max));
    const double ratio = double(std::exp(d.uniform(log_lo, log_hi)));
    const int h = int(std::nearbyint(std::sqrt(erase_area * ratio)));  // half to even
    const int w = int(std::nearbyint(std::sqrt(erase_area / ratio)));
    if (!(h < height && w < width)) continue;
    box.erase = true;
    box.h = h;
    box.w = w;
    box.top = d.below(height - h + 1);
    box.left = d.below(width - w + 1);
    return box;
  }
  return box;
}

EraseBox draw_erasing(const ErasingOptions& opt, int height, int width, uint64_t seed, int64_t epoch,
                      int64_t sample_id) {
  PhiloxDraws d(sample_rng(seed, kErasingStream, epoch, sample_id));
  return erasing_box(opt, height, width, d);
}

void apply_erasing(float* hwc, int height, int width, int channels, const EraseBox& box) {
  if (!box.erase) return;
  for (int y = box.top; y < box.top + box.h && y < height; ++y)
    std::fill_n(hwc + (int64_t(y) * width + box.left) * channels, int64_t(box.w) * channels, 0.f);
}

PairMix draw_pair_mix(const MixOptions& opt, int height, int width, uint64_t seed, int64_t epoch,
                      int64_t first_id) {
  PairMix m;
  if (!opt.enabled()) return m;
  Philox rng = sample_rng(seed, kMixStream, epoch, first_id);
  const float coin = rng.uniform();  // always drawn, so turning one kind on moves nothing
  m.cutmix = opt.cutmix_alpha > 0 && (opt.mixup_alpha <= 0 || coin < opt.switch_prob);
  const double lam = beta_from(m.cutmix ? opt.cutmix_alpha : opt.mixup_alpha, rng);
  if (!m.cutmix) {
    m.lambda = lam;
    return m;
  }
  // timm's rand_bbox: a box of side ratio sqrt(1 - lam) around a uniform centre, clipped.
  const double cut = std::sqrt(1 - lam);
  const int cut_h = int(height * cut), cut_w = int(width * cut);
  const int cy = int(rng.below(uint32_t(height))), cx = int(rng.below(uint32_t(width)));
  const int y1 = std::clamp(cy - cut_h / 2, 0, height), y2 = std::clamp(cy + cut_h / 2, 0, height);
  const int x1 = std::clamp(cx - cut_w / 2, 0, width), x2 = std::clamp(cx + cut_w / 2, 0, width);
  m.top = y1;
  m.left = x1;
  m.h = y2 - y1;
  m.w = x2 - x1;
  m.lambda = 1 - double(m.h) * double(m.w) / (double(height) * double(width));
  return m;
}

void apply_pair_mix(float* a, float* b, int height, int width, int channels, const PairMix& m) {
  if (!m.cutmix) {
    const float l = float(m.lambda), r = 1.f - l;
    const int64_t n = int64_t(height) * width * channels;
    for (int64_t i = 0; i < n; ++i) {
      const float x = a[i], y = b[i];
      a[i] = l * x + r * y;
      b[i] = l * y + r * x;
    }
    return;
  }
  for (int y = m.top; y < m.top + m.h; ++y) {
    float* ra = a + (int64_t(y) * width + m.left) * channels;
    float* rb = b + (int64_t(y) * width + m.left) * channels;
    std::swap_ranges(ra, ra + int64_t(m.w) * channels, rb);
  }
}

double sample_beta(double alpha, uint64_t seed, uint64_t stream) {
  Philox rng(stream_key(seed, kMixStream), uint32_t(stream), uint32_t(stream >> 32), 0x42u);
  return beta_from(alpha, rng);
}

}  // namespace io
}  // namespace spotrain
