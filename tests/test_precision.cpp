// Mixed precision: fp16/bf16 rounding (scalar and Backend::cast over blocked and NHWC
// tensors), the loss scaler's state machine, the fused unscale + overflow check, and max
// pooling's window math. The training step itself (StepRunner) is tested in test_step.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "engine/loss_scaler.h"
#include "core/philox.h"
#include "engine/step.h"
#include "kernels/cpu/blocked.h"
#include "kernels/elementwise.h"
#include "kernels/ops.h"
#include "step_reference.h"

using namespace spotrain;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

std::unique_ptr<Backend> cpu() { return make_backend("cpu", BackendOptions{}); }

float rt_half(float f) { return half_to_float(float_to_half(f)); }
float rt_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// Random values over many binades, both signs: |v| in [2^-30, 2^20], so fp16's subnormal
// range, its normal range and its overflow (>= 65520) are all hit.
std::vector<float> wide_values(int64_t n, uint64_t seed) {
  Philox rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    float mant = 1.0f + rng.uniform();
    int e = int(rng.below(51)) - 30;
    x = std::ldexp(mant, e) * (rng.below(2) ? -1.f : 1.f);
  }
  // The edge cases, spread over the tensor (vector body and scalar tail of a SIMD loop).
  const float special[] = {kInf, -kInf, kNaN, -kNaN, 0.f, -0.f, 65504.f, 65519.f, 65520.f,
                           -65520.f, 1e5f, std::numeric_limits<float>::max(),
                           std::ldexp(1.f, -24), std::ldexp(1.f, -25), std::ldexp(3.f, -25),
                           -std::ldexp(1.f, -25), std::ldexp(1.f, -14),
                           std::nextafter(std::ldexp(1.f, -14), 0.f),
                           std::numeric_limits<float>::denorm_min(), 1.f + std::ldexp(1.f, -11),
                           1.f + std::ldexp(1.f, -8), 1.f + std::ldexp(3.f, -9)};
  size_t k = 0;
  for (float f : special) v[(k++ * 37) % v.size()] = f;
  v[v.size() - 1] = 65520.f;
  v[v.size() - 2] = kNaN;
  return v;
}

// Same value, NaN matching any NaN (hardware converters may keep NaN payload bits).
bool same_value(float a, float b) {
  return std::isnan(a) ? std::isnan(b) : std::memcmp(&a, &b, 4) == 0;
}


// Offset of the logical element (n, c, h, w) in layout l (blocked pads channels to a block).
int64_t offset4(const Shape& s, Layout l, int64_t n, int64_t c, int64_t h, int64_t w) {
  int64_t C = s[1], H = s[2], W = s[3];
  switch (l) {
    case Layout::plain: return ((n * C + c) * H + h) * W + w;
    case Layout::nhwc: return ((n * H + h) * W + w) * C + c;
    case Layout::blocked: {
      const int64_t b = cpu_block_channels();
      return ((n * (cpu_padded_channels(C) / b) + c / b) * H * W + h * W + w) * b + c % b;
    }
  }
  return -1;
}

// A host fp32 4-D tensor in `layout` holding `plain` (row-major N, C, H, W); padding is zero.
Tensor make4(const std::vector<float>& plain, const Shape& s, Layout layout) {
  int64_t store = layout == Layout::blocked ? s[0] * cpu_padded_channels(s[1]) * s[2] * s[3] : shape_numel(s);
  Tensor t(s, DType::f32, Allocator::host(), layout, store);  // (N, C, H, W) fp32 in `layout`
  float* p = t.data<float>();
  std::fill(p, p + store, 0.f);
  int64_t i = 0;
  for (int64_t n = 0; n < s[0]; ++n)
    for (int64_t c = 0; c < s[1]; ++c)
      for (int64_t h = 0; h < s[2]; ++h)
        for (int64_t w = 0; w < s[3]; ++w) p[offset4(s, layout, n, c, h, w)] = plain[size_t(i++)];
  return t;
}

// Fills the host allocator's cache with 0xFF bytes (NaN in fp32, bf16 and fp16) so a
// tensor allocated next and left partly unwritten shows it.
void poison_pool(std::initializer_list<size_t> bytes, int copies = 4) {
  Allocator::host().release_cached();
  std::vector<Tensor> held;
  for (size_t b : bytes)
    for (int i = 0; i < copies; ++i) {
      held.emplace_back(Shape{int64_t(b)}, DType::u8, Allocator::host());
      std::memset(held.back().raw(), 0xff, b);
    }
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

std::vector<float> host_copy(Backend& be, const Tensor& t) {
  Tensor h = be.to_host(t);
  const float* p = h.data<float>();
  return std::vector<float>(p, p + h.numel());
}

}  // namespace

// ---- scalar conversions --------------------------------------------------------------------

TEST(Fp16, LargestFiniteAndOverflowToInf) {
  EXPECT_EQ(float_to_half(65504.f), 0x7bff);
  EXPECT_EQ(rt_half(65504.f), 65504.f);
  EXPECT_EQ(float_to_half(65519.f), 0x7bff);  // below the midpoint 65520: rounds down
  EXPECT_EQ(rt_half(65519.f), 65504.f);
  EXPECT_EQ(float_to_half(65520.f), 0x7c00);  // the midpoint rounds to even: inf
  EXPECT_EQ(rt_half(65520.f), kInf);
  EXPECT_EQ(rt_half(1e5f), kInf);
  EXPECT_EQ(rt_half(-1e5f), -kInf);
  EXPECT_EQ(float_to_half(-1e5f), 0xfc00);
  EXPECT_EQ(rt_half(kInf), kInf);
  EXPECT_EQ(rt_half(-kInf), -kInf);
  EXPECT_EQ(rt_half(std::numeric_limits<float>::max()), kInf);
}

TEST(Fp16, NaNStaysNaN) {
  EXPECT_TRUE(std::isnan(rt_half(kNaN)));
  EXPECT_TRUE(std::isnan(rt_half(-kNaN)));
  // A NaN whose payload lies only in the low mantissa bits must not truncate to inf.
  EXPECT_TRUE(std::isnan(rt_half(bits_f32(0x7f800001u))));
  EXPECT_TRUE(std::isnan(rt_bf16(kNaN)));
  EXPECT_TRUE(std::isnan(rt_bf16(bits_f32(0x7f800001u))));
}

TEST(Fp16, SubnormalsRoundToNearestEven) {
  const float tiny = std::ldexp(1.f, -24);  // smallest fp16 subnormal
  EXPECT_EQ(float_to_half(tiny), 0x0001);
  EXPECT_EQ(rt_half(tiny), tiny);
  EXPECT_EQ(float_to_half(std::ldexp(1.f, -25)), 0x0000);  // tie between 0 and 2^-24: even
  EXPECT_EQ(float_to_half(-std::ldexp(1.f, -25)), 0x8000);  // -0
  EXPECT_EQ(float_to_half(std::ldexp(1.5f, -25)), 0x0001);  // above the tie
  EXPECT_EQ(float_to_half(std::ldexp(3.f, -25)), 0x0002);   // 1.5 ulp: tie to even 2
  EXPECT_EQ(float_to_half(std::ldexp(5.f, -25)), 0x0002);   // 2.5 ulp: tie to even 2
  EXPECT_EQ(float_to_half(std::ldexp(1.f, -14)), 0x0400);   // smallest normal
  EXPECT_EQ(float_to_half(std::ldexp(1023.f, -24)), 0x03ff);  // largest subnormal
  // Just below the smallest normal, rounding carries into the exponent.
  EXPECT_EQ(float_to_half(std::nextafter(std::ldexp(1.f, -14), 0.f)), 0x0400);
  EXPECT_EQ(float_to_half(std::ldexp(1.f, -30)), 0x0000);
}

TEST(Fp16, NormalsRoundToNearestEven) {
  EXPECT_EQ(rt_half(1.f + std::ldexp(1.f, -11)), 1.f);  // half an ulp: tie to even (1)
  EXPECT_EQ(rt_half(1.f + std::ldexp(3.f, -11)), 1.f + std::ldexp(1.f, -9));  // tie to even
  EXPECT_EQ(rt_half(1.f + std::ldexp(1.f, -11) + std::ldexp(1.f, -20)), 1.f + std::ldexp(1.f, -10));
}

TEST(Fp16, EveryHalfValueRoundTrips) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    float f = half_to_float(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_EQ(h & 0x7c00u, 0x7c00u);
      continue;
    }
    ASSERT_EQ(float_to_half(f), h) << std::hex << "half 0x" << h << " = " << f;
  }
}

#ifdef __FLT16_MAX__
// The compiler's own float -> _Float16 conversion (IEEE round to nearest even) as an
// independent reference, over random bit patterns covering every exponent.
TEST(Fp16, MatchesCompilerFloat16ForRandomBits) {
  Philox rng(7);
  for (int i = 0; i < 2000000; ++i) {
    float f = bits_f32(rng.next_u32());
    if (std::isnan(f)) continue;
    _Float16 r = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &r, 2);
    ASSERT_EQ(float_to_half(f), want) << std::hex << "float bits 0x" << f32_bits(f);
  }
}
#endif

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(rt_bf16(1.f + std::ldexp(1.f, -8)), 1.f);  // half an ulp: tie to even
  EXPECT_EQ(rt_bf16(1.f + std::ldexp(3.f, -9)), 1.f + std::ldexp(1.f, -7));  // 0.75 ulp: up
  EXPECT_EQ(rt_bf16(1.f + std::ldexp(3.f, -8)), 1.f + std::ldexp(1.f, -6));  // 1.5 ulp: even
  EXPECT_EQ(rt_bf16(1.f + std::ldexp(1.f, -9)), 1.f);                       // 0.25 ulp: down
  EXPECT_EQ(rt_bf16(-1.f - std::ldexp(3.f, -9)), -1.f - std::ldexp(1.f, -7));
  EXPECT_EQ(rt_bf16(std::numeric_limits<float>::max()), kInf);  // rounds past bf16's max
  EXPECT_EQ(rt_bf16(kInf), kInf);
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    float f = bf16_to_float(uint16_t(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f), h) << std::hex << "bf16 0x" << h;
  }
}

// ---- Backend::cast -------------------------------------------------------------------------

namespace {

// Casts an fp32 tensor to `to` and back; checks shape, layout and storage are preserved and
// that every stored element equals the scalar conversion.
void check_cast(Backend& be, const Tensor& x, DType to) {
  SCOPED_TRACE(std::string(layout_name(x.layout())) + " -> " + dtype_name(to));
  uint16_t (*st)(float) = to == DType::f16 ? float_to_half : float_to_bf16;
  float (*ld)(uint16_t) = to == DType::f16 ? half_to_float : bf16_to_float;
  const int64_t n = x.storage_elems();

  poison_pool({size_t(n) * 2, size_t(n) * 4});
  Tensor y = be.cast(x, to);
  ASSERT_EQ(y.dtype(), to);
  ASSERT_EQ(y.shape(), x.shape());
  ASSERT_EQ(y.layout(), x.layout());
  ASSERT_EQ(y.storage_elems(), n);
  const float* xs = x.data<float>();
  const uint16_t* ys = y.data<uint16_t>();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i)
    if (!same_value(ld(ys[i]), ld(st(xs[i]))) && ++bad <= 5)
      ADD_FAILURE() << "element " << i << ": " << xs[i] << " -> 0x" << std::hex << ys[i]
                    << ", want 0x" << st(xs[i]);
  EXPECT_EQ(bad, 0);

  poison_pool({size_t(n) * 2, size_t(n) * 4});
  Tensor back = be.cast(y, DType::f32);
  ASSERT_EQ(back.dtype(), DType::f32);
  ASSERT_EQ(back.shape(), x.shape());
  ASSERT_EQ(back.layout(), x.layout());
  ASSERT_EQ(back.storage_elems(), n);
  const float* bs = back.data<float>();
  bad = 0;
  for (int64_t i = 0; i < n; ++i)
    if (!same_value(bs[i], ld(ys[i])) && ++bad <= 5) ADD_FAILURE() << "back element " << i;
  EXPECT_EQ(bad, 0);

  // The canonical (plain NCHW) view agrees too: the layout tag was interpreted, not just kept.
  std::vector<float> want = host_copy(be, x), got = host_copy(be, y);
  ASSERT_EQ(got.size(), want.size());
  bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (!same_value(got[i], ld(st(want[i]))) && ++bad <= 5)
      ADD_FAILURE() << "canonical element " << i << ": " << got[i] << " vs " << ld(st(want[i]));
  EXPECT_EQ(bad, 0);
}

}  // namespace

TEST(Cast, BlockedTensorMatchesScalarConversion) {
  auto be = cpu();
  Shape s{2, 20, 5, 7};  // (N, C, H, W); 20 channels: the last block (of 16 or 8) is partly padding
  Tensor x = make4(wide_values(shape_numel(s), 1), s, Layout::blocked);
  ASSERT_EQ(cpu_padded_channels(20), cpu_block_channels() == 16 ? 32 : 24);
  ASSERT_EQ(x.storage_elems(), 2 * cpu_padded_channels(20) * 5 * 7);
  check_cast(*be, x, DType::f16);
  check_cast(*be, x, DType::bf16);
}

TEST(Cast, NhwcTensorMatchesScalarConversion) {
  auto be = cpu();
  Shape s{3, 5, 3, 7};  // 315 elements: not a multiple of 8 or 16
  Tensor x = make4(wide_values(shape_numel(s), 2), s, Layout::nhwc);
  check_cast(*be, x, DType::f16);
  check_cast(*be, x, DType::bf16);
}

TEST(Cast, LargePlainTensorMatchesScalarConversion) {
  auto be = cpu();
  const int64_t n = 100003;  // many threads' worth, with a ragged tail
  std::vector<float> v = wide_values(n, 5);
  Tensor h = Tensor::host({n});  // (n) fp32
  std::copy(v.begin(), v.end(), h.data<float>());
  Tensor x = be->from_host(h);
  check_cast(*be, x, DType::f16);
  check_cast(*be, x, DType::bf16);
}

TEST(Cast, UploadImagesCastsToComputeDtype) {
  auto be = cpu();
  Shape s{2, 3, 4, 5};
  Tensor x = make4(wide_values(shape_numel(s), 3), s, Layout::nhwc);
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor y = be->upload_images(x, dt);
    ASSERT_EQ(y.dtype(), dt);
    ASSERT_EQ(y.shape(), s);
    std::vector<float> want = host_copy(*be, x), got = host_copy(*be, y);
    for (size_t i = 0; i < want.size(); ++i) {
      float w = dt == DType::f16 ? rt_half(want[i]) : rt_bf16(want[i]);
      ASSERT_TRUE(same_value(got[i], w)) << dtype_name(dt) << " element " << i;
    }
  }
}

TEST(Cast, Bf16RelativeErrorWithinHalfUlp) {
  auto be = cpu();
  const int64_t n = 1 << 16;
  Philox rng(4);
  Tensor x = Tensor::host({n});  // (n) fp32
  float* p = x.data<float>();
  for (int64_t i = 0; i < n; ++i)  // normal floats over ~70 binades
    p[i] = rng.normal() * std::ldexp(1.f, int(rng.below(70)) - 35);
  Tensor back = be->cast(be->cast(be->from_host(x), DType::bf16), DType::f32);
  std::vector<float> got = host_copy(*be, back);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] == 0.f) continue;
    worst = std::max(worst, std::fabs(double(got[size_t(i)]) - double(p[i])) / std::fabs(double(p[i])));
  }
  EXPECT_LE(worst, std::ldexp(1.0, -8));
  EXPECT_GT(worst, std::ldexp(1.0, -10));  // it did round (to 8 significant bits)
}

// ---- loss scaler ---------------------------------------------------------------------------

namespace {
LossScalerOptions dynamic_opts() {
  LossScalerOptions o;
  o.enabled = true;
  o.init_scale = 1024;
  o.growth_interval = 3;
  o.max_consecutive_overflows = 5;
  return o;
}
}  // namespace

TEST(LossScaler, DisabledIsScaleOneAndNeverChanges) {
  LossScalerOptions o;
  o.enabled = false;
  o.init_scale = 4096;
  o.max_consecutive_overflows = 1;
  LossScaler s(o);
  EXPECT_FALSE(s.enabled());
  EXPECT_EQ(s.scale(), 1.0);
  LossScalerState before = s.state();
  for (int i = 0; i < 10; ++i) s.update(i % 2 == 0);  // would throw if it counted overflows
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_EQ(s.state().scale, before.scale);
  EXPECT_EQ(s.state().skipped_steps, 0);
  EXPECT_EQ(s.state().good_steps, 0);
  EXPECT_EQ(s.state().consecutive_overflows, 0);
}

TEST(LossScaler, DynamicGrowsAfterIntervalAndBacksOffOnOverflow) {
  LossScaler s(dynamic_opts());
  EXPECT_EQ(s.scale(), 1024.0);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_EQ(s.state().good_steps, 2);
  s.update(false);  // third finite step in a row: doubles
  EXPECT_EQ(s.scale(), 2048.0);
  EXPECT_EQ(s.state().good_steps, 0);

  s.update(false);
  s.update(false);
  EXPECT_EQ(s.state().good_steps, 2);
  s.update(true);  // overflow: halves and resets the growth counter
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_EQ(s.state().good_steps, 0);
  EXPECT_EQ(s.state().skipped_steps, 1);
  EXPECT_EQ(s.state().consecutive_overflows, 1);
  s.update(true);
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.state().skipped_steps, 2);
  EXPECT_EQ(s.state().consecutive_overflows, 2);

  s.update(false);  // a finite step ends the run of overflows
  EXPECT_EQ(s.state().consecutive_overflows, 0);
  EXPECT_EQ(s.state().skipped_steps, 2);
  EXPECT_EQ(s.scale(), 512.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 512.0);  // only 2 good steps since the backoff
  s.update(false);
  EXPECT_EQ(s.scale(), 1024.0);
}

TEST(LossScaler, StaticScaleNeverChangesButCountsOverflows) {
  LossScalerOptions o = dynamic_opts();
  o.static_scale = 128;
  LossScaler s(o);
  EXPECT_EQ(s.scale(), 128.0);
  for (int i = 0; i < 10; ++i) s.update(false);  // > growth_interval: no growth
  EXPECT_EQ(s.scale(), 128.0);
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_EQ(s.state().skipped_steps, 2);
  EXPECT_EQ(s.state().consecutive_overflows, 2);
  s.update(false);
  EXPECT_EQ(s.state().consecutive_overflows, 0);
  EXPECT_EQ(s.scale(), 128.0);
}

TEST(LossScaler, TooManyConsecutiveOverflowsThrow) {
  LossScalerOptions o = dynamic_opts();
  o.max_consecutive_overflows = 3;
  LossScaler s(o);
  s.update(true);
  s.update(true);
  s.update(false);  // resets the run: the next two overflows are fine
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.state().consecutive_overflows, 2);
  EXPECT_EQ(s.state().skipped_steps, 4);
  try {
    s.update(true);
    FAIL() << "the third overflow in a row must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("consecutive"), std::string::npos) << e.what();
  }
  // The same limit with a static scale.
  o.static_scale = 64;
  LossScaler st(o);
  st.update(true);
  st.update(true);
  EXPECT_THROW(st.update(true), Error);
}

TEST(LossScaler, StateRoundTrips) {
  LossScaler a(dynamic_opts());
  a.update(false);
  a.update(true);
  a.update(false);
  a.update(true);  // in the middle of a run of overflows
  LossScaler b(dynamic_opts());
  b.set_state(a.state());
  EXPECT_EQ(b.state().scale, a.state().scale);
  EXPECT_EQ(b.state().good_steps, a.state().good_steps);
  EXPECT_EQ(b.state().skipped_steps, a.state().skipped_steps);
  EXPECT_EQ(b.state().consecutive_overflows, a.state().consecutive_overflows);
  EXPECT_EQ(a.state().consecutive_overflows, 1);
  for (bool of : {false, false, true, false}) {
    a.update(of);
    b.update(of);
  }
  EXPECT_EQ(a.scale(), b.scale());
  EXPECT_EQ(a.state().good_steps, b.state().good_steps);
  EXPECT_EQ(a.state().skipped_steps, b.state().skipped_steps);
  EXPECT_EQ(a.state().consecutive_overflows, b.state().consecutive_overflows);
}

// ---- unscale + overflow check --------------------------------------------------------------

TEST(UnscaleAndCheck, FiniteGradientsAreScaledExactly) {
  auto be = cpu();
  const int64_t n = 1 << 20;
  const float inv = 1.0f / 1000.0f;  // not a power of two: every product rounds
  Philox rng(11);
  Tensor h = Tensor::host({n});  // (n) fp32 gradients
  float* p = h.data<float>();
  // |v| in [1e-3, 1e5]: products stay normal, far from both ends of the float range.
  for (int64_t i = 0; i < n; ++i)
    p[i] = (rng.below(2) ? -1.f : 1.f) * std::pow(10.f, -3.f + 8.f * rng.uniform());
  Tensor g = be->from_host(h);
  EXPECT_FALSE(be->unscale_and_check(g, inv));
  std::vector<float> got = host_copy(*be, g);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    float want = p[i] * inv;
    if (!same_bits(got[size_t(i)], want) && ++bad <= 5)
      ADD_FAILURE() << "element " << i << ": " << got[size_t(i)] << " vs " << want;
  }
  EXPECT_EQ(bad, 0);
}

TEST(UnscaleAndCheck, OneNonFiniteAnywhereIsReported) {
  auto be = cpu();
  const int64_t n = 1 << 20;
  Philox rng(12);
  Tensor h = Tensor::host({n});  // (n) fp32 gradients
  float* p = h.data<float>();
  for (int64_t i = 0; i < n; ++i) p[i] = rng.normal();
  std::vector<int64_t> where = {0, n / 2, n - 1, int64_t(rng.below(uint32_t(n))),
                                int64_t(rng.below(uint32_t(n)))};
  for (float bad : {kInf, -kInf, kNaN}) {
    for (int64_t at : where) {
      SCOPED_TRACE(::testing::Message() << bad << " at " << at);
      float keep = p[at];
      p[at] = bad;
      Tensor g = be->from_host(h);
      EXPECT_TRUE(be->unscale_and_check(g, 1.0f / 65536.0f));
      p[at] = keep;
    }
  }
  Tensor g = be->from_host(h);  // and clean again: no stale verdict
  EXPECT_FALSE(be->unscale_and_check(g, 1.0f / 65536.0f));
}

namespace {
// Forward by scanning each window (pool_takes), backward by gathering through
// pool_windows_holding, exactly as cuda_kernels.cu does, on one (h, w) plane.
void pool_gather(const std::vector<float>& x, int h, int w, int k, int s, int pad,
                 const std::vector<float>& dy, std::vector<float>& y, std::vector<float>& dx) {
  const int oh = (h + 2 * pad - k) / s + 1, ow = (w + 2 * pad - k) / s + 1;
  std::vector<int> at(size_t(oh * ow));
  y.assign(size_t(oh * ow), 0.f);
  for (int i = 0; i < oh; ++i)
    for (int j = 0; j < ow; ++j) {
      float best = 0.f;
      int a = -1;
      for (int kh = 0; kh < k; ++kh)
        for (int kw = 0; kw < k; ++kw) {
          int ih = i * s - pad + kh, iw = j * s - pad + kw;
          if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
          if (a < 0 || spotrain::pool_takes(x[size_t(ih * w + iw)], best)) {
            best = x[size_t(ih * w + iw)];
            a = kh * k + kw;
          }
        }
      y[size_t(i * ow + j)] = best;
      at[size_t(i * ow + j)] = a;
    }
  dx.assign(size_t(h * w), 0.f);
  for (int ih = 0; ih < h; ++ih)
    for (int iw = 0; iw < w; ++iw) {
      int o0, o1, p0, p1;
      spotrain::pool_windows_holding(ih, k, s, pad, oh, o0, o1);
      spotrain::pool_windows_holding(iw, k, s, pad, ow, p0, p1);
      for (int i = o0; i <= o1; ++i)
        for (int j = p0; j <= p1; ++j)
          if (at[size_t(i * ow + j)] == (ih - (i * s - pad)) * k + (iw - (j * s - pad)))
            dx[size_t(ih * w + iw)] += dy[size_t(i * ow + j)];
    }
}
}  // namespace

TEST(MaxPoolMath, WindowsHoldingAnInputAreExactlyThoseThatContainIt) {
  for (int k = 1; k <= 5; ++k)
    for (int s = 1; s <= 3; ++s)
      for (int pad = 0; pad < k; ++pad)
        for (int n = k; n <= 13; ++n) {
          const int out = (n + 2 * pad - k) / s + 1;
          for (int i = 0; i < n; ++i) {
            int o0, o1;
            spotrain::pool_windows_holding(i, k, s, pad, out, o0, o1);
            for (int o = 0; o < out; ++o) {
              bool holds = o * s - pad <= i && i < o * s - pad + k;
              EXPECT_EQ(holds, o0 <= o && o <= o1)
                  << "k " << k << " s " << s << " pad " << pad << " n " << n << " i " << i << " o " << o;
            }
          }
        }
}

TEST(MaxPoolMath, GatheredBackwardEqualsScatteringEachWindowsGradientToItsMaximum) {
  spotrain::Philox rng(7, 1);
  for (int k : {2, 3}) {
    for (int s : {1, 2}) {
      const int pad = k / 2, h = 9, w = 8;
      const int oh = (h + 2 * pad - k) / s + 1, ow = (w + 2 * pad - k) / s + 1;
      for (bool ties : {false, true}) {
        std::vector<float> x(size_t(h * w)), dy(size_t(oh * ow));
        for (auto& v : x) v = ties ? float(rng.below(3)) : rng.normal();
        for (auto& v : dy) v = float(1 + rng.below(9));
        std::vector<float> y, dx;
        pool_gather(x, h, w, k, s, pad, dy, y, dx);
        std::vector<float> ref(size_t(h * w), 0.f);
        for (int i = 0; i < oh; ++i)
          for (int j = 0; j < ow; ++j) {  // scatter: the first maximum of the window gets dy
            int bi = -1;
            for (int kh = 0; kh < k; ++kh)
              for (int kw = 0; kw < k; ++kw) {
                int ih = i * s - pad + kh, iw = j * s - pad + kw;
                if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
                if (bi < 0 || x[size_t(ih * w + iw)] > x[size_t(bi)]) bi = ih * w + iw;
              }
            EXPECT_EQ(y[size_t(i * ow + j)], x[size_t(bi)]);
            ref[size_t(bi)] += dy[size_t(i * ow + j)];
          }
        EXPECT_EQ(dx, ref) << "k " << k << " s " << s << (ties ? " with ties" : "");
      }
    }
  }
}
