// SVE2 variant of the attention walk: the NEON float loops (attention_neon.h) with the int8
// cache rows dequantized by vector-length-agnostic SVE code (sign-extending loads, one
// multiply per value, as the reference); head_dim % 4 == 0.
#include <arm_sve.h>

#include "attention/attention_neon.h"

namespace shrike::sve2 {
namespace {

struct Sve2Vec : neon_attention::NeonVec {
  using NeonVec::to_float;
  static void to_float(const int8_t* row, float* dst, int64_t d) {
    const svfloat32_t scale = svdup_n_f32(kv_int8_scale(row, d));
    for (int64_t i = 0; i < d; i += static_cast<int64_t>(svcntw())) {
      const svbool_t lanes = svwhilelt_b32_s64(i, d);
      const svint32_t q = svld1sb_s32(lanes, row + i);
      svst1_f32(lanes, dst + i, svmul_f32_x(lanes, svcvt_f32_s32_x(lanes, q), scale));
    }
  }
};

}  // namespace

void attend(const PagedAttentionArgs& args, const AttentionWorkItem& item, float* scratch) {
  attention_detail::attend<Sve2Vec>(args, item, scratch);
}

}  // namespace shrike::sve2
