// Causal attention of new query tokens over a paged KV cache (decode, prefill and chunked
// prefill in one op), with an online softmax: every query row keeps a running max and sum
// while it walks over key tiles, so no score matrix is ever materialised.
//
// Sequence b owns query rows [query_start[b], query_start[b+1]) and, after this step, holds
// context_lens[b] tokens in the cache. Its new tokens sit at the last positions, so query j of
// the sequence sees keys 0 .. context_len - query_len + j. Position p of the sequence lives in
// cache slot block_tables[b][p / block_size] * block_size + p % block_size.
// GQA: query head h reads KV head h / (num_heads / num_kv_heads).
//
// An int8 cache (cache_dtype i8) holds rows of head_dim int8 values plus a float32 scale
// (attention/kv_int8.h); the fp32 walks dequantize them tile by tile, the int16-dot walk
// (attention/int16_walk.h) and the AMX walk multiply the int8 values as integers.
//
// Decode at long context is split by keys as well (split-K): a sequence with few new tokens
// gets one work item per kSplitKeys keys and KV head, each leaving an unnormalised partial
// result, merged by log-sum-exp at the end. The split depends only on the sequence's own
// lengths, never on the thread count or the rest of the batch, so results are reproducible.
//
// Sliding window (sliding_window = W > 0): the query at position p sees only keys p - W + 1 .. p,
// and the kernel reads nothing older, so cache blocks wholly before the window may be reused.
#pragma once
#include <cstdint>

#include "common/dtype.h"

namespace shrike {

struct PagedAttentionArgs {
  const void* q;            // (T, num_heads, head_dim), q_dtype
  const void* key_cache;    // (slots, num_kv_heads, head_dim) cache_dtype, or (slots, num_kv_heads, head_dim + 4) i8
  const void* value_cache;  // like key_cache
  void* out;                // (T, num_heads, head_dim), q_dtype
  const int32_t* block_tables;  // (num_seqs, max_blocks)
  const int32_t* query_start;   // (num_seqs + 1,)
  const int32_t* context_lens;  // (num_seqs,)
  int64_t num_seqs, max_blocks, num_heads, num_kv_heads, head_dim, block_size;
  float scale;
  DType q_dtype, cache_dtype;
  int64_t sliding_window;  // 0: full causal attention; W > 0: each query sees its last W positions
};

// Arguments are trusted (the bindings check them).
void paged_attention(const PagedAttentionArgs& args);

// One unit of parallel work: `q_count` consecutive new tokens of one sequence, starting at
// its `q_begin`-th new token, times the query heads of one KV head, over the keys
// [key_begin, key_end) (clipped to what each token may see). With `partial` set, the item
// writes its unnormalised result there instead of to `out`:
//   partial: (rows, head_dim + 2) per row: acc[head_dim], running max, running sum.
struct AttentionWorkItem {
  int64_t seq, kv_head, q_begin, q_count;
  int64_t key_begin = 0, key_end = INT64_MAX;
  float* partial = nullptr;
};

// Keys handled per online-softmax step; a tile never crosses a cache block.
constexpr int64_t kAttentionTileKeys = 32;
// Keys per split-K item (a multiple of the tile), and the most new tokens a sequence may have
// for its items to be split by keys (decode and short speculative verification). 256 rather than more: a model
// with few KV heads (SmolLM2: 3) then has enough items at a few hundred tokens to keep every thread busy.
constexpr int64_t kSplitKeys = 256;
constexpr int64_t kSplitMaxQueryLen = 8;

// Floats of per-thread scratch a work item of `rows` query rows needs (layout in attention_tiles.h).
constexpr int64_t attention_scratch_floats(int64_t rows, int64_t head_dim) {
  return rows * (2 * head_dim + kAttentionTileKeys + 2) + 2 * kAttentionTileKeys * head_dim;
}

// Per-variant work item kernels. avx2 needs head_dim % 8 == 0, avx512vnni % 16 == 0,
// dotprod (plain NEON) and sve2 % 4 == 0.
#define SHRIKE_DECLARE_ATTEND \
  void attend(const PagedAttentionArgs& args, const AttentionWorkItem& item, float* scratch);
namespace ref { SHRIKE_DECLARE_ATTEND }
namespace avx2 { SHRIKE_DECLARE_ATTEND }
namespace avx512vnni { SHRIKE_DECLARE_ATTEND }
namespace dotprod { SHRIKE_DECLARE_ATTEND }
namespace sve2 { SHRIKE_DECLARE_ATTEND }
// AMX-BF16 tiles (attention/amx_walk.h): bf16 queries over a bf16 or int8 cache, head_dim % 32 == 0;
// and its scalar model, the same arithmetic bit for bit on any CPU.
namespace amx { SHRIKE_DECLARE_ATTEND }
namespace amx_ref { SHRIKE_DECLARE_ATTEND }
// int16 dot products (attention/int16_walk.h): bf16 queries over an int8 cache, head_dim % 32 == 0 and <= 256;
// and its scalar model, the same arithmetic bit for bit on any CPU.
namespace avx512vnni_int16 { SHRIKE_DECLARE_ATTEND }
namespace int16_ref { SHRIKE_DECLARE_ATTEND }
#undef SHRIKE_DECLARE_ATTEND

// Query rows per work item of the AMX walk: it carries them all through each key tile, the cache
// being read once for them (reading the cache, not the tile arithmetic, bounds a prefill's attention).
constexpr int64_t kAmxItemRows = 128;
// Floats of per-thread scratch amx::attend and amx_ref::attend need for one work item.
int64_t amx_attention_scratch_floats(int64_t head_dim);
// Whether the AMX kernel's arithmetic serves these arguments (the AMX kernel itself runs them when
// the active variant is amx).
bool amx_attention_serves(const PagedAttentionArgs& args);
// Floats of per-thread scratch the int16-dot walk needs for an item of `rows` query rows.
int64_t int16_attention_scratch_floats(int64_t rows, int64_t head_dim);
// Whether the int16-dot walk's arithmetic serves these arguments.
bool int16_attention_serves(const PagedAttentionArgs& args);
// Which walk paged_attention runs at the active level for these dtypes and head_dim (for shrike doctor):
// "amx" (tiles), "avx512vnni-int16", "avx512vnni", "avx2", "sve2", "neon" or "scalar".
const char* attention_variant(DType q_dtype, DType cache_dtype, int64_t head_dim);
// paged_attention with every work item run by amx_ref::attend, whatever the CPU: the bits the AMX
// kernel must give. Only for arguments amx_attention_serves.
void paged_attention_amx_reference(const PagedAttentionArgs& args);
// paged_attention with every work item run by int16_ref::attend: the bits the avx512vnni-int16 walk must
// give. Only for arguments int16_attention_serves.
void paged_attention_int16_reference(const PagedAttentionArgs& args);

}  // namespace shrike
