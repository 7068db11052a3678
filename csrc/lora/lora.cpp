#include "lora/lora.h"

namespace shrike::lora {
namespace {

struct NoCall {};

const Variant<ApplyFn, NoCall> kApply[] = {
#if defined(SHRIKE_X86)
    {Isa::avx512vnni, avx512vnni::apply},
    {Isa::avx2, avx2::apply},
#endif
    {Isa::scalar, ref::apply},
};

}  // namespace

void apply(const Slots& w, const void* x, DType x_dtype, const int32_t* row_slots, int64_t rows, void* out,
           DType out_dtype) {
  pick_variant(kApply, NoCall{}).fn(w, x, x_dtype, row_slots, rows, out, out_dtype);
}

OpVariants lora_variants() { return describe_variants("lora", kApply); }

}  // namespace shrike::lora
