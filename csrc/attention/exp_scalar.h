// exp_nonpositive (exp_avx512.h) one lane at a time, for the scalar models of the AVX-512 walks
// (attention_amx_ref.cpp, attention_int16_ref.cpp): max_ps(x, c) is x > c ? x : c (c for NaN),
// fnmadd(n, c, x) is fma(-n, c, x). Those files compile without floating-point contraction.
// Internal linkage: each including file compiles it with its own flags.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace shrike {
namespace {

inline float exp_nonpositive_scalar(float x) {
  x = x > -87.3f ? x : -87.3f;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  x = std::fma(-n, 0.693359375f, x);
  x = std::fma(-n, -2.12194440e-4f, x);
  float y = 1.9875691500e-4f;
  y = std::fma(y, x, 1.3981999507e-3f);
  y = std::fma(y, x, 8.3334519073e-3f);
  y = std::fma(y, x, 4.1665795894e-2f);
  y = std::fma(y, x, 1.6666665459e-1f);
  y = std::fma(y, x, 5.0000001201e-1f);
  y = std::fma(y, x * x, x + 1.f);
  const uint32_t pow2n_bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float pow2n;
  std::memcpy(&pow2n, &pow2n_bits, 4);
  return y * pow2n;
}

}  // namespace
}  // namespace shrike
