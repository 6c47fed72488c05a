// Philox-4x32-10 counter-based RNG (Salmon et al., SC'11). Every random choice in
// spotrain is a pure function of (key, counter), e.g. key = seed, counter = (epoch,
// sample index, purpose): results do not depend on thread count, rank count or order.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define SPOTRAIN_HD __host__ __device__ inline
#else
#define SPOTRAIN_HD inline
#endif

namespace spotrain {

struct Philox4 {
  uint32_t v[4];
};

SPOTRAIN_HD uint32_t philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  uint64_t p = uint64_t(a) * uint64_t(b);
  *hi = uint32_t(p >> 32);
  return uint32_t(p);
}

// Ten rounds over a 128-bit counter with a 64-bit key.
SPOTRAIN_HD Philox4 philox4x32(Philox4 ctr, uint64_t key64) {
  uint32_t k0 = uint32_t(key64), k1 = uint32_t(key64 >> 32);
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, hi1;
    uint32_t lo0 = philox_mulhilo(0xD2511F53u, ctr.v[0], &hi0);
    uint32_t lo1 = philox_mulhilo(0xCD9E8D57u, ctr.v[2], &hi1);
    ctr = Philox4{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return ctr;
}

// A stream of random numbers for one (seed, a, b, c) tuple: draws 4 words per block.
class Philox {
 public:
  SPOTRAIN_HD Philox(uint64_t seed, uint32_t a = 0, uint32_t b = 0, uint32_t c = 0)
      : key_(seed), ctr_{{0, a, b, c}} {}
  // Jumps to the start of block `block` (4 words each): the stream from there is the one a
  // fresh generator reaches after 4 x block draws of next_u32.
  SPOTRAIN_HD void seek(uint32_t block) {
    ctr_.v[0] = block;
    idx_ = 4;
  }
  SPOTRAIN_HD uint32_t next_u32() {
    if (idx_ == 4) {
      buf_ = philox4x32(ctr_, key_);
      ctr_.v[0]++;
      idx_ = 0;
    }
    return buf_.v[idx_++];
  }
  // Uniform in [0, 1) with 24 bits.
  SPOTRAIN_HD float uniform() { return float(next_u32() >> 8) * (1.0f / 16777216.0f); }
  // Uniform integer in [0, n) (n > 0), without modulo bias worth noting for n << 2^32.
  SPOTRAIN_HD uint32_t below(uint32_t n) { return uint32_t((uint64_t(next_u32()) * n) >> 32); }
  // Standard normal by Box-Muller.
  SPOTRAIN_HD float normal() {
    float u1 = uniform(), u2 = uniform();
    if (u1 < 1e-7f) u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
  }

 private:
  uint64_t key_;
  Philox4 ctr_;
  Philox4 buf_{};
  int idx_ = 4;
};

}  // namespace spotrain
