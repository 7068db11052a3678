// IEEE half precision <-> float for values that are exact in both (the fp16 scales of GGUF blocks).
// Plain bit arithmetic, so the scalar references need no F16C or Arm fp16 support.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace shrike {

using f16 = uint16_t;

inline float f16_to_float(f16 h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | mantissa << 13;
  } else if (exponent != 0) {
    bits = sign | (exponent + 112) << 23 | mantissa << 13;
  } else {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float v = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -v : v;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The half holding exactly v, or false when there is none (too many significant bits, out of range, NaN).
inline bool float_to_f16_exact(float v, f16* out) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  const f16 sign = static_cast<f16>((bits >> 16) & 0x8000u);
  const float magnitude = std::fabs(v);
  f16 h;
  if (magnitude >= 6.103515625e-05f && magnitude <= 65504.f) {  // normal halves
    h = static_cast<f16>(sign | (((bits >> 23) & 0xffu) - 112) << 10 | ((bits >> 13) & 0x3ffu));
  } else if (magnitude < 6.103515625e-05f) {  // subnormal halves: multiples of 2^-24
    h = static_cast<f16>(sign | static_cast<uint32_t>(std::ldexp(magnitude, 24)));
  } else {
    return false;
  }
  const float back = f16_to_float(h);
  if (std::memcmp(&back, &v, 4) != 0) return false;
  *out = h;
  return true;
}

}  // namespace shrike
