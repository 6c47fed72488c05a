// Element types, devices and layouts a Tensor can carry, with their sizes and names.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace spotrain {

enum class DType : uint8_t { f32, bf16, f16, u8, i32 };
enum class Device : uint8_t { cpu, cuda };

// Physical arrangement of a 4-D tensor whose logical shape is always (N, C, H, W).
//   plain     : row-major over the logical shape (also every non-4-D tensor)
//   nhwc      : canonical image layout (loader, GPU backend, interop)
//   blocked   : a backend's own blocked arrangement, which only that backend reads (the CPU
//               backend's is oneDNN's nChw16c, or nChw8c without AVX-512: channels padded
//               to a multiple of 16 or 8)
enum class Layout : uint8_t { plain, nhwc, blocked };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::bf16: case DType::f16: return 2;
    case DType::u8: return 1;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "fp32";
    case DType::bf16: return "bf16";
    case DType::f16: return "fp16";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
  }
  return "?";
}

inline const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::plain: return "plain";
    case Layout::nhwc: return "nhwc";
    case Layout::blocked: return "blocked";
  }
  return "?";
}

}  // namespace spotrain
