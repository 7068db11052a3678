#include "norm/rmsnorm.h"

#include "common/variants.h"

namespace shrike {
namespace {

using RmsnormFn = void (*)(const void*, const void*, void*, int64_t, int64_t, float, DType);
struct NoCall {};

const Variant<RmsnormFn, NoCall> kRmsnorm[] = {
#if defined(SHRIKE_X86)
    {Isa::avx2, avx2::rmsnorm},
#endif
    {Isa::scalar, ref::rmsnorm},
};

}  // namespace

void rmsnorm(const void* x, const void* weight, void* out, int64_t rows, int64_t dim, float eps, DType dtype) {
  pick_variant(kRmsnorm, NoCall{}).fn(x, weight, out, rows, dim, eps, dtype);
}

OpVariants rmsnorm_variants() { return describe_variants("rmsnorm", kRmsnorm); }

}  // namespace shrike
