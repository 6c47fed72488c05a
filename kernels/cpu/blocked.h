// What the CPU backend takes from the processor: its blocked activation layout
// (Layout::blocked) is oneDNN's nChw16c where oneDNN has AVX-512 kernels and nChw8c (AVX2's)
// elsewhere, channels padded to a whole block (oneDNN has no fast kernels for the other
// width: nChw16c on an AVX2 processor falls back to reference code hundreds of times
// slower); and oneDNN 2.6 computes bf16 only with AVX-512.
#pragma once
#include <cstdint>

namespace spotrain {

// Whether oneDNN's effective instruction set has AVX-512 (decided once per process).
bool cpu_avx512();
// Whether oneDNN's effective instruction set has AMX with bf16 (Sapphire Rapids and later).
bool cpu_amx_bf16();
// 16 or 8.
inline int cpu_block_channels() { return cpu_avx512() ? 16 : 8; }
inline int64_t cpu_padded_channels(int64_t c) {
  const int64_t b = cpu_block_channels();
  return (c + b - 1) / b * b;
}

}  // namespace spotrain
