// Dispatch: cut the batch into (sequence, KV head, query block) work items and run them on the
// thread pool with the active variant.
#include "attention/attention.h"

#include <algorithm>
#include <vector>

#include "common/isa.h"
#include "runtime/threadpool.h"

namespace shrike {
namespace {

using AttendFn = void (*)(const PagedAttentionArgs&, const AttentionWorkItem&, float*);

AttendFn attend_kernel(int64_t head_dim) {
#if defined(SHRIKE_X86)
  if (isa_at_least(Isa::avx2) && head_dim % 8 == 0) return avx2::attend;
#elif defined(SHRIKE_AARCH64)
  // Every aarch64 variant (dotprod, i8mm, sve2) implies the NEON float code.
  if (active_isa() != Isa::scalar && head_dim % 4 == 0) return dotprod::attend;
#endif
  return ref::attend;
}

// Query rows (tokens x heads of a group) per work item: enough that each key/value tile,
// once in L1, serves many rows; few enough that a prefill splits into many items.
constexpr int64_t kRowsPerItem = 32;
// Multiply-adds below which waking the pool costs more than it saves.
constexpr int64_t kSerialWork = 1 << 17;

}  // namespace

void paged_attention(const PagedAttentionArgs& a) {
  const int64_t group = a.num_heads / a.num_kv_heads;
  const int64_t tokens_per_item = std::max<int64_t>(1, kRowsPerItem / group);
  std::vector<AttentionWorkItem> items;
  int64_t work = 0;
  for (int64_t b = 0; b < a.num_seqs; ++b) {
    const int64_t q_len = a.query_start[b + 1] - a.query_start[b];
    const int64_t seen =
        a.sliding_window > 0 ? std::min<int64_t>(a.context_lens[b], a.sliding_window) : a.context_lens[b];
    work += q_len * seen;
    // Later query blocks see more keys: queue them first so the long items do not come last.
    for (int64_t end = q_len; end > 0; end -= tokens_per_item) {
      const int64_t begin = std::max<int64_t>(0, end - tokens_per_item);
      for (int64_t h = 0; h < a.num_kv_heads; ++h) items.push_back({b, h, begin, end - begin});
    }
  }
  work *= 2 * a.num_heads * a.head_dim;

  const AttendFn attend = attend_kernel(a.head_dim);
  const int64_t scratch_floats = attention_scratch_floats(tokens_per_item * group, a.head_dim);
  auto run = [&](int64_t i) {
    thread_local std::vector<float> scratch;
    if (static_cast<int64_t>(scratch.size()) < scratch_floats) scratch.resize(scratch_floats);
    attend(a, items[i], scratch.data());
  };
  const int64_t n_items = static_cast<int64_t>(items.size());
  if (work < kSerialWork) {
    for (int64_t i = 0; i < n_items; ++i) run(i);
  } else {
    runtime::parallel_for(n_items, [&](int64_t i) { run(i); });
  }
}

}  // namespace shrike
