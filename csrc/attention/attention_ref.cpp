// Portable scalar inner loops of the attention walk (attention_tiles.h).
#include <cmath>

#include "attention/attention_tiles.h"

namespace shrike::ref {
namespace {

struct ScalarVec {
  static void load_scaled(const float* src, float scale, float* dst, int64_t d) {
    for (int64_t i = 0; i < d; ++i) dst[i] = src[i] * scale;
  }
  static void load_scaled(const bf16* src, float scale, float* dst, int64_t d) {
    for (int64_t i = 0; i < d; ++i) dst[i] = bf16_to_float(src[i]) * scale;
  }
  static void to_float(const bf16* src, float* dst, int64_t d) {
    for (int64_t i = 0; i < d; ++i) dst[i] = bf16_to_float(src[i]);
  }
  // One int8 cache row (kv_int8.h) dequantized: value * scale, one rounding, as in every variant.
  static void to_float(const int8_t* row, float* dst, int64_t d) {
    const float scale = kv_int8_scale(row, d);
    for (int64_t i = 0; i < d; ++i) dst[i] = static_cast<float>(row[i]) * scale;
  }
  // scores[j] = q . key_j for the n keys at k + j * k_stride.
  static void query_key_scores(const float* q, const float* k, int64_t k_stride, int64_t n, int64_t d, float* scores) {
    for (int64_t j = 0; j < n; ++j) {
      float dot = 0.f;
      for (int64_t i = 0; i < d; ++i) dot += q[i] * k[j * k_stride + i];
      scores[j] = dot;
    }
  }
  // p[j] = exp(p[j] - shift); returns the sum of the new p.
  static float exp_shifted(float* p, int64_t n, float shift) {
    float sum = 0.f;
    for (int64_t j = 0; j < n; ++j) sum += (p[j] = std::exp(p[j] - shift));
    return sum;
  }
  // acc = acc * rescale + sum_j p[j] * value_j
  static void rescale_accumulate(float* acc, float rescale, const float* p, const float* v, int64_t v_stride, int64_t n,
                                 int64_t d) {
    for (int64_t i = 0; i < d; ++i) {
      float sum = acc[i] * rescale;
      for (int64_t j = 0; j < n; ++j) sum += p[j] * v[j * v_stride + i];
      acc[i] = sum;
    }
  }
  static void store_scaled(const float* acc, float factor, float* dst, int64_t d) {
    for (int64_t i = 0; i < d; ++i) dst[i] = acc[i] * factor;
  }
  static void store_scaled(const float* acc, float factor, bf16* dst, int64_t d) {
    for (int64_t i = 0; i < d; ++i) dst[i] = float_to_bf16(acc[i] * factor);
  }
};

}  // namespace

void attend(const PagedAttentionArgs& args, const AttentionWorkItem& item, float* scratch) {
  attention_detail::attend<ScalarVec>(args, item, scratch);
}

}  // namespace shrike::ref
