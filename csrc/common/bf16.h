// bfloat16 <-> float conversion (round to nearest even, NaN kept quiet), as torch does it.
#pragma once
#include <cstdint>
#include <cstring>

namespace shrike {

using bf16 = uint16_t;

inline float bf16_to_float(bf16 v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline bf16 float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<bf16>(bits >> 16);
}

}  // namespace shrike
