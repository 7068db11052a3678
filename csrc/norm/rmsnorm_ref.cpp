#include <cmath>

#include "common/bf16.h"
#include "norm/rmsnorm.h"

namespace shrike::ref {

namespace {
template <typename T> float load(const T* p, int64_t i);
template <> float load<float>(const float* p, int64_t i) { return p[i]; }
template <> float load<bf16>(const bf16* p, int64_t i) { return bf16_to_float(p[i]); }

// Rounding to the storage type between the two multiplications is part of the semantics.
inline float round_to(float v, const float*) { return v; }
inline float round_to(float v, const bf16*) { return bf16_to_float(float_to_bf16(v)); }
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(bf16* p, int64_t i, float v) { p[i] = float_to_bf16(v); }

template <typename T>
void rmsnorm_typed(const T* x, const T* w, T* out, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    T* yr = out + r * dim;
    float sum_sq = 0.f;
    for (int64_t i = 0; i < dim; ++i) {
      float v = load(xr, i);
      sum_sq += v * v;
    }
    float inv = 1.f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) store(yr, i, load(w, i) * round_to(load(xr, i) * inv, xr));
  }
}
}  // namespace

void rmsnorm(const void* x, const void* weight, void* out, int64_t rows, int64_t dim, float eps, DType dtype) {
  if (dtype == DType::f32)
    rmsnorm_typed(static_cast<const float*>(x), static_cast<const float*>(weight), static_cast<float*>(out), rows, dim, eps);
  else
    rmsnorm_typed(static_cast<const bf16*>(x), static_cast<const bf16*>(weight), static_cast<bf16*>(out), rows, dim, eps);
}

}  // namespace shrike::ref
