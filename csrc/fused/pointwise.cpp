// Pointwise steps some architectures add to the Llama decoder (Gemma's GeGLU and logit
// soft-capping, MiniCPM's scalings). Portable: plain arithmetic the compiler vectorises (no libm
// call per element), rounded to the activation dtype where the PyTorch code would store.
#include <cstdint>
#include <cstring>

#include "common/bf16.h"
#include "fused/fused.h"

namespace shrike {
namespace {

// tanh(u) = sign(u) (1 - e) / (1 + e), e = exp(-2|u|): e^x for x <= 0 by 2^n * polynomial, rounding
// n with the 1.5 * 2^23 trick so that the loop vectorises without SSE4.1. Within a few float ulps.
inline float tanh_fast(float u) {
  float x = -2.f * (u < 0 ? -u : u);
  x = x > -87.f ? x : -87.f;
  const float n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + (r + 1.f);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float pow2n;
  std::memcpy(&pow2n, &bits, 4);
  const float e = p * pow2n;
  const float t = (1.f - e) / (1.f + e);
  return u < 0 ? -t : t;
}

inline float gelu_tanh(float g) {
  const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);
  return 0.5f * g * (1.f + tanh_fast(inner));
}

inline float load(const void* p, int64_t i, DType dt) {
  return dt == DType::f32 ? static_cast<const float*>(p)[i] : bf16_to_float(static_cast<const bf16*>(p)[i]);
}
inline void store(void* p, int64_t i, float v, DType dt) {
  if (dt == DType::f32)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<bf16*>(p)[i] = float_to_bf16(v);
}
inline float round_to(float v, DType dt) { return dt == DType::f32 ? v : bf16_to_float(float_to_bf16(v)); }

}  // namespace

void gelu_tanh_mul(const void* gate_up, void* out, int64_t rows, int64_t width, DType dtype) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t in = r * 2 * width;
    for (int64_t i = 0; i < width; ++i) {
      const float act = round_to(gelu_tanh(load(gate_up, in + i, dtype)), dtype);
      store(out, r * width + i, act * load(gate_up, in + width + i, dtype), dtype);
    }
  }
}

void scale_values(void* x, int64_t count, float factor, bool divide, DType dtype) {
  for (int64_t i = 0; i < count; ++i) {
    const float v = load(x, i, dtype);
    store(x, i, divide ? v / factor : v * factor, dtype);
  }
}

void softcap(float* x, int64_t count, float cap) {
  for (int64_t i = 0; i < count; ++i) x[i] = tanh_fast(x[i] / cap) * cap;
}

}  // namespace shrike
