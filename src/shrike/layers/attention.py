"""Causal self-attention over a paged KV cache (C++ kernel, with a PyTorch reference path)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from shrike import _C
from shrike.engine.batch import BatchContext
from shrike.layers import kv_int8

_KERNEL_DTYPES = (torch.float32, torch.bfloat16)
_KERNEL_CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.int8)


class KVCache:
    """One layer's keys and values in fixed-size blocks shared by all sequences.

    dtype torch.int8 keeps each (slot, KV head) row as int8 values plus their scale
    (shrike.layers.kv_int8), so `key` and `value` are (slots, kv_heads, head_dim + 4) int8.
    """

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype):
        self.head_dim = head_dim
        row = kv_int8.row_bytes(head_dim) if dtype == torch.int8 else head_dim
        # Uninitialised on purpose: attention reads only slots written earlier, and untouched
        # pages of a large cache then cost no memory.
        self.key = torch.empty(num_blocks * block_size, num_kv_heads, row, dtype=dtype)  # (slots, kv_heads, row)
        self.value = torch.empty_like(self.key)  # (slots, kv_heads, row)

    @property
    def quantized(self) -> bool:
        return self.key.dtype == torch.int8

    def write(self, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: (tokens, kv_heads, head_dim) in any float dtype."""
        if self.quantized:
            self.key[slot_mapping] = kv_int8.quantize(k)
            self.value[slot_mapping] = kv_int8.quantize(v)
            return
        self.key[slot_mapping] = k.to(self.key.dtype)
        self.value[slot_mapping] = v.to(self.value.dtype)

    def read(self, slots: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of `slots` as (len(slots), kv_heads, head_dim) `dtype` (int8 rows dequantized)."""
        return read_cache(self.key, slots, dtype), read_cache(self.value, slots, dtype)


def read_cache(cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """cache[slots] as values of `dtype`: int8 rows dequantized, float caches converted."""
    rows = cache[slots]
    return (kv_int8.dequantize(rows) if cache.dtype == torch.int8 else rows).to(dtype)


def visible_keys(q_len: int, context: int, sliding_window: int = 0) -> tuple[int, torch.Tensor]:
    """(first key position any query sees, (q_len, context - first) bool mask of what each sees).

    Query j sits at position context - q_len + j and sees keys up to it, and with a sliding window
    W > 0 only the last W of them. Keys before the first are never read (their blocks may be reused)."""
    first = max(0, context - q_len - sliding_window + 1) if sliding_window > 0 else 0
    q_pos = torch.arange(context - q_len, context)[:, None]
    keys = torch.arange(first, context)[None, :]
    mask = keys <= q_pos
    return first, (mask & (keys > q_pos - sliding_window) if sliding_window > 0 else mask)


def _sequence_slots(block_table: list[int], block_size: int, length: int) -> torch.Tensor:
    blocks = torch.tensor(block_table, dtype=torch.int64)
    offsets = torch.arange(block_size, dtype=torch.int64)
    return (blocks[:, None] * block_size + offsets[None, :]).reshape(-1)[:length]  # (length,)


def paged_attention(q: torch.Tensor, cache: KVCache, ctx: BatchContext, scale: float,
                    sliding_window: int = 0) -> torch.Tensor:
    """q: (T, heads, head_dim) -> (T, heads, head_dim). The new tokens' K/V are already in `cache`.
    sliding_window W > 0: each query sees only its last W positions."""
    if q.dtype in _KERNEL_DTYPES and cache.key.dtype in _KERNEL_CACHE_DTYPES:
        q = q.contiguous()
        out = torch.empty_like(q)
        block_tables, query_start, context_lens = ctx.kernel_args
        _C.paged_attention(q, cache.key, cache.value, block_tables, query_start, context_lens, ctx.block_size,
                           scale, out, sliding_window)
        return out
    return paged_attention_reference(q, cache, ctx, scale, sliding_window)


def paged_attention_reference(q: torch.Tensor, cache: KVCache, ctx: BatchContext, scale: float,
                              sliding_window: int = 0) -> torch.Tensor:
    """PyTorch version of `paged_attention`, for tests and for what the kernel does not take."""
    out = torch.empty_like(q)
    start = 0
    for q_len, ctx_len, table in zip(ctx.query_lens, ctx.context_lens, ctx.block_tables):
        first, mask = visible_keys(q_len, ctx_len, sliding_window)  # mask: (q_len, keys)
        slots = _sequence_slots(table, ctx.block_size, ctx_len)[first:]
        k, v = (t.transpose(0, 1) for t in cache.read(slots, q.dtype))  # (kv_heads, keys, head_dim)
        qs = q[start:start + q_len].transpose(0, 1)  # (heads, q_len, head_dim)
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        out[start:start + q_len] = o.transpose(0, 1)
        start += q_len
    return out
