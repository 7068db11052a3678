// Portable on purpose: these loops move a few KB per token and the compiler vectorises them;
// what fusing saves is Python dispatch and extra passes, not arithmetic. The exception is
// silu*up, whose expf per element does not vectorise: silu_mul_avx512vnni.cpp and silu_mul_avx2.cpp.
#include "fused/fused.h"

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attention/kv_int8.h"
#include "common/bf16.h"
#include "common/variants.h"
#include "norm/rmsnorm.h"

namespace shrike {
namespace {

template <typename T> struct Elem;
template <> struct Elem<float> {
  static float load(const float* p, int64_t i) { return p[i]; }
  static void store(float* p, int64_t i, float v) { p[i] = v; }
  static float round(float v) { return v; }
};
template <> struct Elem<bf16> {
  static float load(const bf16* p, int64_t i) { return bf16_to_float(p[i]); }
  static void store(bf16* p, int64_t i, float v) { p[i] = float_to_bf16(v); }
  static float round(float v) { return bf16_to_float(float_to_bf16(v)); }
};

template <typename T>
void add_typed(const T* x, T* residual, int64_t n) {
  for (int64_t i = 0; i < n; ++i) Elem<T>::store(residual, i, Elem<T>::load(residual, i) + Elem<T>::load(x, i));
}

template <typename T>
void silu_mul_typed(const T* gate_up, T* out, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = gate_up + r * 2 * width;
    const T* up = gate + width;
    T* o = out + r * width;
    for (int64_t i = 0; i < width; ++i) {
      float g = Elem<T>::load(gate, i);
      float act = Elem<T>::round(g / (1.f + std::exp(-g)));
      Elem<T>::store(o, i, act * Elem<T>::load(up, i));
    }
  }
}

// x * cos + rotate_half(x) * sin with rotate_half(x) = [-x2, x1], each product rounded like torch.
template <typename T, typename C>
void rotate_store(const T* x, const float* cos, const float* sin, C* out, int64_t d) {
  int64_t half = d / 2;
  for (int64_t i = 0; i < d; ++i) {
    float rotated = i < half ? -Elem<T>::load(x, i + half) : Elem<T>::load(x, i - half);
    float a = Elem<T>::round(Elem<T>::load(x, i) * Elem<T>::round(cos[i]));
    float b = Elem<T>::round(rotated * Elem<T>::round(sin[i]));
    Elem<C>::store(out, i, Elem<T>::round(a + b));
  }
}

template <typename T, typename C>
void rope_kv_typed(const RopeKvArgs& a) {
  const int64_t d = a.head_dim, h = a.num_heads, hkv = a.num_kv_heads;
  const int64_t row = (h + 2 * hkv) * d;
  for (int64_t t = 0; t < a.tokens; ++t) {
    const T* qkv = static_cast<const T*>(a.qkv) + t * row;
    const float* cos = a.cos + t * d;
    const float* sin = a.sin + t * d;
    T* q_out = static_cast<T*>(a.q_out) + t * h * d;
    for (int64_t head = 0; head < h; ++head) rotate_store(qkv + head * d, cos, sin, q_out + head * d, d);
    const T* k = qkv + h * d;
    const T* v = k + hkv * d;
    if constexpr (std::is_same_v<C, int8_t>) {
      // Rotated k (rounded to T, as the other caches store it) and v, quantized per head.
      int8_t* k_slot = static_cast<int8_t*>(a.key_cache) + a.slot_mapping[t] * hkv * kv_int8_row_bytes(d);
      int8_t* v_slot = static_cast<int8_t*>(a.value_cache) + a.slot_mapping[t] * hkv * kv_int8_row_bytes(d);
      thread_local std::vector<float> head_values;
      head_values.resize(d);
      for (int64_t head = 0; head < hkv; ++head) {
        rotate_store(k + head * d, cos, sin, head_values.data(), d);
        kv_int8_quantize(head_values.data(), d, k_slot + head * kv_int8_row_bytes(d));
        for (int64_t i = 0; i < d; ++i) head_values[i] = Elem<T>::load(v + head * d, i);
        kv_int8_quantize(head_values.data(), d, v_slot + head * kv_int8_row_bytes(d));
      }
    } else {
      C* k_slot = static_cast<C*>(a.key_cache) + a.slot_mapping[t] * hkv * d;
      C* v_slot = static_cast<C*>(a.value_cache) + a.slot_mapping[t] * hkv * d;
      for (int64_t head = 0; head < hkv; ++head) rotate_store(k + head * d, cos, sin, k_slot + head * d, d);
      for (int64_t i = 0; i < hkv * d; ++i) Elem<C>::store(v_slot, i, Elem<T>::load(v, i));
    }
  }
}

}  // namespace

void add_rmsnorm(const void* x, void* residual, const void* weight, void* out, int64_t rows, int64_t dim, float eps,
                 DType dtype) {
  if (dtype == DType::f32)
    add_typed(static_cast<const float*>(x), static_cast<float*>(residual), rows * dim);
  else
    add_typed(static_cast<const bf16*>(x), static_cast<bf16*>(residual), rows * dim);
  rmsnorm(residual, weight, out, rows, dim, eps, dtype);
}

void embedding(const int64_t* token_ids, int64_t tokens, const void* table, int64_t dim, void* out, float scale,
               DType dtype) {
  const size_t row = dim * (dtype == DType::f32 ? 4 : 2);
  for (int64_t t = 0; t < tokens; ++t)
    std::memcpy(static_cast<char*>(out) + t * row, static_cast<const char*>(table) + token_ids[t] * row, row);
  if (scale == 1.0f) return;
  if (dtype == DType::f32) {
    float* v = static_cast<float*>(out);
    for (int64_t i = 0; i < tokens * dim; ++i) v[i] *= scale;
  } else {
    bf16* v = static_cast<bf16*>(out);
    for (int64_t i = 0; i < tokens * dim; ++i) v[i] = float_to_bf16(bf16_to_float(v[i]) * scale);
  }
}

namespace {
void silu_mul_ref(const void* gate_up, void* out, int64_t rows, int64_t width, DType dtype) {
  if (dtype == DType::f32)
    silu_mul_typed(static_cast<const float*>(gate_up), static_cast<float*>(out), rows, width);
  else
    silu_mul_typed(static_cast<const bf16*>(gate_up), static_cast<bf16*>(out), rows, width);
}

using SiluMulFn = void (*)(const void*, void*, int64_t, int64_t, DType);
struct NoCall {};

const Variant<SiluMulFn, NoCall> kSiluMul[] = {
#if defined(SHRIKE_X86)
    {Isa::avx512vnni, avx512vnni::silu_mul},
    {Isa::avx2, avx2::silu_mul},
#endif
    {Isa::scalar, silu_mul_ref},
};
}  // namespace

void silu_mul(const void* gate_up, void* out, int64_t rows, int64_t width, DType dtype) {
  pick_variant(kSiluMul, NoCall{}).fn(gate_up, out, rows, width, dtype);
}

OpVariants silu_mul_variants() { return describe_variants("silu_mul", kSiluMul); }

void rope_write_kv(const RopeKvArgs& a) {
  const bool act32 = a.act_dtype == DType::f32, cache32 = a.cache_dtype == DType::f32;
  if (a.cache_dtype == DType::i8) return act32 ? rope_kv_typed<float, int8_t>(a) : rope_kv_typed<bf16, int8_t>(a);
  if (act32 && cache32) return rope_kv_typed<float, float>(a);
  if (act32) return rope_kv_typed<float, bf16>(a);
  if (cache32) return rope_kv_typed<bf16, float>(a);
  rope_kv_typed<bf16, bf16>(a);
}

}  // namespace shrike
