// Dispatch: reorder the activations of act-order weights, pick the variant, then spread
// (row block, output block) tasks over the thread pool. A task computes whole dot products, so
// the split never changes a result.
#include "weight_only/weight_only.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "common/variants.h"
#include "runtime/threadpool.h"
#include "weight_only/weight_only_kernels.h"

namespace shrike {
namespace {

using Block = void (*)(const WeightOnlyProblem&, int64_t, int64_t, int64_t, int64_t);

struct NoCall {};

const Variant<Block, NoCall> kWeightOnly[] = {
#if defined(SHRIKE_X86)
    {Isa::avx512vnni, avx512vnni::weight_only_block},
    {Isa::avx2, avx2::weight_only_block},
#elif defined(SHRIKE_AARCH64)
    {Isa::dotprod, dotprod::weight_only_block},
#endif
    {Isa::scalar, ref::weight_only_block},
};

Block weight_only_kernel() { return pick_variant(kWeightOnly, NoCall{}).fn; }

constexpr int64_t kSerialWork = 1 << 18;  // multiply-adds below which threads cost more than they save
constexpr int64_t kRowsPerTask = 64;

int64_t outputs_per_task(int64_t n, int64_t row_tasks) {
  int64_t want_tasks = runtime::num_threads() * 8;
  int64_t per = std::clamp<int64_t>((n * row_tasks + want_tasks - 1) / want_tasks, 8, 64);
  return (per + 7) / 8 * 8;
}

// x with its columns in W's order: gathered[r, j] = x[r, perm[j]].
const void* permuted(const void* x, DType dt, int64_t m, int64_t k, const int32_t* perm,
                     std::vector<uint8_t>& buffer) {
  const size_t e = dt == DType::f32 ? 4 : 2;
  buffer.resize(static_cast<size_t>(m * k) * e);
  const uint8_t* src = static_cast<const uint8_t*>(x);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < k; ++j)
      std::memcpy(buffer.data() + (r * k + j) * e, src + (r * k + perm[j]) * e, e);
  return buffer.data();
}

}  // namespace

void weight_only_linear(const void* x, DType x_dtype, int64_t m, const WeightOnlyWeight& w, const float* bias,
                        void* out, DType out_dtype) {
  if (m < 0 || w.n < 0 || w.k < 0) throw std::invalid_argument("weight_only_linear: negative dimension");
  if (w.bits != 4 && w.bits != 8) throw std::invalid_argument("weight_only_linear: bits must be 4 or 8");
  if (w.k % 32 || w.group <= 0 || w.group % 32 || w.k % w.group)
    throw std::invalid_argument("weight_only_linear: K and the group size must be multiples of 32, K of the group");
  if (m == 0 || w.n == 0) return;
  thread_local std::vector<uint8_t> gathered;
  if (w.perm) x = permuted(x, x_dtype, m, w.k, w.perm, gathered);
  WeightOnlyProblem p{x, x_dtype, w, bias, out, out_dtype, m};
  Block kernel = weight_only_kernel();
  if (m * w.n * w.k < kSerialWork) return kernel(p, 0, m, 0, w.n);
  int64_t row_tasks = (m + kRowsPerTask - 1) / kRowsPerTask;
  int64_t per = outputs_per_task(w.n, row_tasks);
  int64_t col_tasks = (w.n + per - 1) / per;
  runtime::parallel_for(row_tasks * col_tasks, [&](int64_t t) {
    int64_t rt = t % row_tasks, ct = t / row_tasks;
    kernel(p, rt * kRowsPerTask, std::min(m, (rt + 1) * kRowsPerTask), ct * per, std::min(w.n, (ct + 1) * per));
  });
}

OpVariants weight_only_variants() { return describe_variants("weight_only_linear", kWeightOnly); }

}  // namespace shrike
