// Dispatch: cut the batch into (sequence, KV head, query block[, key chunk]) work items, run them
// on the thread pool with the active variant, then merge the split-K partial results.
#include "attention/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/bf16.h"
#include "common/variants.h"
#include "runtime/threadpool.h"

namespace shrike {
namespace {

using AttendFn = void (*)(const PagedAttentionArgs&, const AttentionWorkItem&, float*);

// Query rows (tokens x heads of a group) per work item: enough that each key/value tile,
// once in L1, serves many rows; few enough that a prefill splits into many items. (The AMX walk
// takes kAmxItemRows.)
constexpr int64_t kRowsPerItem = 32;

struct Kernel {
  AttendFn attend;
  int64_t scratch_floats;  // per thread
  int64_t rows_per_item;
};

Kernel walk(AttendFn attend, const PagedAttentionArgs& a) {
  const int64_t group = a.num_heads / a.num_kv_heads;
  const int64_t rows = std::max<int64_t>(1, kRowsPerItem / group) * group;
  return {attend, attention_scratch_floats(rows, a.head_dim), kRowsPerItem};
}

Kernel amx_walk(AttendFn attend, const PagedAttentionArgs& a) {
  return {attend, amx_attention_scratch_floats(a.head_dim), kAmxItemRows};
}

Kernel int16_walk(AttendFn attend, const PagedAttentionArgs& a) {
  const int64_t group = a.num_heads / a.num_kv_heads;
  const int64_t rows = std::max<int64_t>(1, kRowsPerItem / group) * group;
  return {attend, int16_attention_scratch_floats(rows, a.head_dim), kRowsPerItem};
}

bool int8_cache_hd16(const PagedAttentionArgs& a) { return a.head_dim % 16 == 0 && a.cache_dtype == DType::i8; }
bool hd8(const PagedAttentionArgs& a) { return a.head_dim % 8 == 0; }
bool hd4(const PagedAttentionArgs& a) { return a.head_dim % 4 == 0; }

// A variant: the work-item kernel and the walk that sizes its items and scratch.
struct AttentionKernel {
  AttendFn attend;
  Kernel (*walk)(AttendFn, const PagedAttentionArgs&);
};

// AMX tiles serve bf16 queries over bf16 and int8 caches. Without them, bf16 queries over an int8 cache take
// the int16-dot walk (integer products; measured in benchmarks/README.md against the fp32 walk and bf16 caches).
// Of the fp32 walks, the AVX-512 one serves int8 caches (where it widens 16 values per instruction); float
// caches keep the AVX2 walk: the 16-lane sums round differently, which flipped near-tie greedy tokens in the
// model tests calibrated against it. Every aarch64 level implies the NEON float code.
const Variant<AttentionKernel, PagedAttentionArgs> kAttention[] = {
#if defined(SHRIKE_X86)
    {Isa::amx, {amx::attend, amx_walk}, amx_attention_serves, "bf16 queries, bf16 or int8 cache, head_dim % 32 == 0"},
    {Isa::avx512vnni, {avx512vnni_int16::attend, int16_walk}, int16_attention_serves,
     "bf16 queries, int8 cache, head_dim % 32 == 0 and <= 256", "avx512vnni-int16"},
    {Isa::avx512vnni, {avx512vnni::attend, walk}, int8_cache_hd16, "int8 cache, head_dim % 16 == 0"},
    {Isa::avx2, {avx2::attend, walk}, hd8, "head_dim % 8 == 0"},
#elif defined(SHRIKE_AARCH64)
    {Isa::sve2, {sve2::attend, walk}, hd4, "head_dim % 4 == 0"},
    {Isa::dotprod, {dotprod::attend, walk}, hd4, "head_dim % 4 == 0", "neon"},
#endif
    {Isa::scalar, {ref::attend, walk}},
};

const Variant<AttentionKernel, PagedAttentionArgs>& attention_kernel(const PagedAttentionArgs& a) {
  return pick_variant(kAttention, a);
}

Kernel attend_kernel(const PagedAttentionArgs& a) {
  const AttentionKernel& k = attention_kernel(a).fn;
  return k.walk(k.attend, a);
}

// Multiply-adds below which waking the pool costs more than it saves.
constexpr int64_t kSerialWork = 1 << 17;

// Split-K items of one (sequence, KV head, query block) and where their partials are.
struct SplitGroup {
  int64_t seq, kv_head, q_begin, q_count;
  size_t first_item, first_partial;  // in `items`, and offset of chunk 0 in the partial buffer
  int64_t chunks, item_stride;        // chunk c is items[first_item + c * item_stride]
};

// out rows of `g` = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) s_c over its key chunks c.
template <class TQ>
void merge_split(const PagedAttentionArgs& a, const SplitGroup& g, const float* partials, int64_t group) {
  const int64_t d = a.head_dim, rows = g.q_count * group, chunk_floats = rows * (d + 2);
  const int64_t token0 = a.query_start[g.seq] + g.q_begin, head0 = g.kv_head * group;
  std::vector<float> sum_acc(d);
  for (int64_t r = 0; r < rows; ++r) {
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < g.chunks; ++c) max = std::max(max, partials[g.first_partial + c * chunk_floats + r * (d + 2) + d]);
    std::fill(sum_acc.begin(), sum_acc.end(), 0.f);
    float sum = 0.f;
    for (int64_t c = 0; c < g.chunks; ++c) {
      const float* p = partials + g.first_partial + c * chunk_floats + r * (d + 2);
      if (p[d] == -std::numeric_limits<float>::infinity()) continue;  // the row saw no key of this chunk
      const float weight = std::exp(p[d] - max);
      sum += weight * p[d + 1];
      for (int64_t i = 0; i < d; ++i) sum_acc[i] += weight * p[i];
    }
    const int64_t t = r / group, h = r % group;
    TQ* out = static_cast<TQ*>(a.out) + ((token0 + t) * a.num_heads + head0 + h) * d;
    for (int64_t i = 0; i < d; ++i) {
      const float v = sum_acc[i] / sum;
      if constexpr (std::is_same_v<TQ, float>) out[i] = v; else out[i] = float_to_bf16(v);
    }
  }
}

void run_items(const PagedAttentionArgs& a, const Kernel& kernel) {
  const int64_t group = a.num_heads / a.num_kv_heads;
  const int64_t tokens_per_item = std::max<int64_t>(1, kernel.rows_per_item / group);
  std::vector<AttentionWorkItem> items;
  std::vector<SplitGroup> splits;
  size_t partial_floats = 0;
  int64_t work = 0;
  for (int64_t b = 0; b < a.num_seqs; ++b) {
    const int64_t q_len = a.query_start[b + 1] - a.query_start[b], context = a.context_lens[b];
    work += q_len * (a.sliding_window > 0 ? std::min<int64_t>(context, a.sliding_window) : context);
    // A windowed layer reads at most its window: no split needed, and none would start before it.
    const bool split = a.sliding_window == 0 && q_len <= kSplitMaxQueryLen && context > kSplitKeys;
    // Later query blocks see more keys: queue them first so the long items do not come last.
    for (int64_t end = q_len; end > 0; end -= tokens_per_item) {
      const int64_t begin = std::max<int64_t>(0, end - tokens_per_item);
      if (!split) {
        for (int64_t h = 0; h < a.num_kv_heads; ++h) items.push_back({b, h, begin, end - begin});
        continue;
      }
      const int64_t chunks = (context + kSplitKeys - 1) / kSplitKeys;
      for (int64_t h = 0; h < a.num_kv_heads; ++h) {
        splits.push_back({b, h, begin, end - begin, items.size() + h, partial_floats, chunks, a.num_kv_heads});
        partial_floats += chunks * (end - begin) * group * (a.head_dim + 2);
      }
      // Chunk by chunk, every KV head: the heads' items over the same keys run side by side, so the cache
      // lines they share (a slot holds the rows of all heads) are read from memory once.
      for (int64_t c = 0; c < chunks; ++c)
        for (int64_t h = 0; h < a.num_kv_heads; ++h)
          items.push_back({b, h, begin, end - begin, c * kSplitKeys, (c + 1) * kSplitKeys, nullptr});
    }
  }
  work *= 2 * a.num_heads * a.head_dim;

  // The buffer is sized only now, so items get their partial pointers only now.
  // (A lambda run on a worker would see the worker's own thread_local: use the pointer.)
  thread_local std::vector<float> partial_buffer;
  if (partial_buffer.size() < partial_floats) partial_buffer.resize(partial_floats);
  float* const partials = partial_buffer.data();
  for (const SplitGroup& g : splits)
    for (int64_t c = 0; c < g.chunks; ++c)
      items[g.first_item + c * g.item_stride].partial =
          partials + g.first_partial + c * g.q_count * group * (a.head_dim + 2);

  auto run = [&](int64_t i) {
    thread_local std::vector<float> scratch;
    if (static_cast<int64_t>(scratch.size()) < kernel.scratch_floats) scratch.resize(kernel.scratch_floats);
    kernel.attend(a, items[i], scratch.data());
  };
  const int64_t n_items = static_cast<int64_t>(items.size());
  if (work < kSerialWork) {
    for (int64_t i = 0; i < n_items; ++i) run(i);
  } else {
    runtime::parallel_for(n_items, [&](int64_t i) { run(i); });
  }
  if (splits.empty()) return;
  auto merge = [&](int64_t i) {
    if (a.q_dtype == DType::f32) merge_split<float>(a, splits[i], partials, group);
    else merge_split<bf16>(a, splits[i], partials, group);
  };
  const int64_t n_splits = static_cast<int64_t>(splits.size());
  if (n_splits == 1) merge(0);
  else runtime::parallel_for(n_splits, [&](int64_t i) { merge(i); });
}

}  // namespace

bool amx_attention_serves(const PagedAttentionArgs& a) {
  return a.q_dtype == DType::bf16 && (a.cache_dtype == DType::bf16 || a.cache_dtype == DType::i8) && a.head_dim % 32 == 0;
}

bool int16_attention_serves(const PagedAttentionArgs& a) {
  return a.q_dtype == DType::bf16 && a.cache_dtype == DType::i8 && a.head_dim % 32 == 0 && a.head_dim <= 256;
}

void paged_attention(const PagedAttentionArgs& a) { run_items(a, attend_kernel(a)); }

const char* attention_variant(DType q_dtype, DType cache_dtype, int64_t head_dim) {
  PagedAttentionArgs a{};
  a.q_dtype = q_dtype, a.cache_dtype = cache_dtype, a.head_dim = head_dim, a.num_heads = a.num_kv_heads = 1;
  const auto& v = attention_kernel(a);
  return v.name ? v.name : isa_name(v.level);
}

OpVariants attention_variants() { return describe_variants("paged_attention", kAttention); }

void paged_attention_amx_reference(const PagedAttentionArgs& a) {
  run_items(a, amx_walk(amx_ref::attend, a));
}

void paged_attention_int16_reference(const PagedAttentionArgs& a) {
  run_items(a, int16_walk(int16_ref::attend, a));
}

}  // namespace shrike
