"""The paged KV cache of one layer."""
from __future__ import annotations

import torch

from shrike import kv_int8


class KVCache:
    """One layer's keys and values in fixed-size blocks shared by all sequences.

    dtype torch.int8 keeps each (slot, KV head) row as int8 values plus their scale
    (shrike.kv_int8), so `key` and `value` are (slots, kv_heads, head_dim + 4) int8.
    """

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype):
        self.head_dim = head_dim
        row = kv_int8.row_bytes(head_dim) if dtype == torch.int8 else head_dim
        # Uninitialised on purpose: attention reads only slots written earlier, and untouched
        # pages of a large cache then cost no memory.
        self.key = torch.empty(num_blocks * block_size, num_kv_heads, row, dtype=dtype)  # (slots, kv_heads, row)
        self.value = torch.empty_like(self.key)  # (slots, kv_heads, row)
