"""The paged KV cache of one layer, and how its rows are read back for the reference attention op."""
from __future__ import annotations

import torch

from shrike.layers import kv_int8


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
