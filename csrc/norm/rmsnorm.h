// RMSNorm over the last dimension, the way Hugging Face Llama computes it:
// the normalisation runs in fp32, is rounded to the input dtype, then multiplied by the
// weight and rounded again. x, weight and out share one dtype.
#pragma once
#include <cstdint>

#include "common/dtype.h"

namespace shrike {

// x, out: (rows, dim) contiguous; weight: (dim,)
void rmsnorm(const void* x, const void* weight, void* out, int64_t rows, int64_t dim, float eps, DType dtype);

namespace ref {
void rmsnorm(const void* x, const void* weight, void* out, int64_t rows, int64_t dim, float eps, DType dtype);
}
namespace avx2 {
void rmsnorm(const void* x, const void* weight, void* out, int64_t rows, int64_t dim, float eps, DType dtype);
}

}  // namespace shrike
