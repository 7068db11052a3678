#include "norm/rmsnorm.h"

#include "common/isa.h"

namespace shrike {

void rmsnorm(const void* x, const void* weight, void* out, int64_t rows, int64_t dim, float eps, DType dtype) {
#if defined(SHRIKE_X86)
  if (isa_at_least(Isa::avx2)) return avx2::rmsnorm(x, weight, out, rows, dim, eps, dtype);
#endif
  ref::rmsnorm(x, weight, out, rows, dim, eps, dtype);
}

}  // namespace shrike
