// Dispatch: pick the variant, then spread (row block, output block) tasks over the thread pool.
// A task computes whole dot products, so the split never changes a result (dense_kernels.h).
#include "dense/dense.h"

#include <algorithm>
#include <stdexcept>

#include "common/isa.h"
#include "dense/dense_kernels.h"
#include "runtime/threadpool.h"

namespace shrike {
namespace {

using DenseBlock = void (*)(const DenseProblem&, int64_t, int64_t, int64_t, int64_t);

DenseBlock dense_kernel() {
#if defined(SHRIKE_X86)
  if (isa_at_least(Isa::avx512bf16)) return avx512bf16::dense_block;
  if (isa_at_least(Isa::avx2)) return avx2::dense_block;
#elif defined(SHRIKE_AARCH64)
  if (isa_at_least(Isa::dotprod)) return dotprod::dense_block;
#endif
  return ref::dense_block;
}

constexpr int64_t kSerialWork = 1 << 18;  // multiply-adds below which threads cost more than they save
// Rows per task: a task's activations (64 x K) stay in L2 while its weight rows are reused.
constexpr int64_t kRowsPerTask = 64;

// Decode wants many small output blocks so a slow core cannot stall the call; the block stays a
// multiple of 8 so the variants' register blocks are full.
int64_t outputs_per_task(int64_t n, int64_t row_tasks) {
  int64_t threads = runtime::num_threads();
  int64_t want_tasks = threads * 8;
  int64_t per = (n * row_tasks + want_tasks - 1) / want_tasks;
  per = std::clamp<int64_t>(per, 8, 64);
  return (per + 7) / 8 * 8;
}

}  // namespace

void dense_linear(const void* x, DType x_dtype, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n,
                  const float* bias, void* out, DType out_dtype) {
  if (m < 0 || n < 0 || k < 0) throw std::invalid_argument("dense_linear: negative dimension");
  if (m == 0 || n == 0) return;
  DenseProblem p{x, x_dtype, w, w_dtype, bias, out, out_dtype, m, n, k};
  DenseBlock kernel = dense_kernel();
  if (m * n * k < kSerialWork) return kernel(p, 0, m, 0, n);
  int64_t row_tasks = (m + kRowsPerTask - 1) / kRowsPerTask;
  int64_t per = outputs_per_task(n, row_tasks);
  int64_t col_tasks = (n + per - 1) / per;
  runtime::parallel_for(row_tasks * col_tasks, [&](int64_t t) {
    int64_t rt = t % row_tasks, ct = t / row_tasks;
    kernel(p, rt * kRowsPerTask, std::min(m, (rt + 1) * kRowsPerTask), ct * per, std::min(n, (ct + 1) * per));
  });
}

}  // namespace shrike
