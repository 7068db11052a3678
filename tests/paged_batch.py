"""A batch of sequences over a paged KV cache, as the attention tests drive the kernel with it, and the PyTorch
attention over such a cache that the kernel is held against. (The engine itself steps through shrike.executor.)"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F

from shrike import _C
from shrike import kv_int8
from shrike.layers.attention import KVCache
from shrike.ops import read_cache, visible_keys

_KERNEL_DTYPES = (torch.float32, torch.bfloat16)
_KERNEL_CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.int8)


@dataclass
class BatchContext:
    """Tokens of several sequences flattened into one batch.

    Sequence i contributes query_lens[i] new tokens; after this step its KV cache holds
    context_lens[i] tokens (the cached prefix plus the new ones).
    """

    positions: torch.Tensor  # (T,) int64 position of each new token in its sequence
    slot_mapping: torch.Tensor  # (T,) int64 flat KV-cache slot each new token is written to
    query_lens: list[int]  # (B,) new tokens per sequence, sum = T
    context_lens: list[int]  # (B,) tokens in each sequence's cache after this step
    block_tables: list[list[int]]  # (B, blocks) KV block ids of each sequence, in order
    block_size: int
    use_long_rope: torch.Tensor | None = None  # (T,) bool, only for LongRoPE models

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @cached_property
    def kernel_args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(block_tables (B, max_blocks), query_start (B+1,), context_lens (B,)) as int32 for the
        attention kernel; built once per step and shared by every layer."""
        width = max((len(t) for t in self.block_tables), default=0) or 1
        padded = [t + [0] * (width - len(t)) for t in self.block_tables]
        tables = torch.tensor(padded, dtype=torch.int32).reshape(-1, width)
        query_start = torch.zeros(len(self.query_lens) + 1, dtype=torch.int32)
        query_start[1:] = torch.tensor(self.query_lens, dtype=torch.int32).cumsum(0)
        return tables, query_start, torch.tensor(self.context_lens, dtype=torch.int32)


def write_kv(cache: KVCache, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """k, v: (tokens, kv_heads, head_dim) in any float dtype, written (int8 caches: quantized) at slot_mapping."""
    if cache.key.dtype == torch.int8:
        cache.key[slot_mapping] = kv_int8.quantize(k)
        cache.value[slot_mapping] = kv_int8.quantize(v)
        return
    cache.key[slot_mapping] = k.to(cache.key.dtype)
    cache.value[slot_mapping] = v.to(cache.value.dtype)


def _sequence_slots(block_table: list[int], block_size: int, length: int) -> torch.Tensor:
    blocks = torch.tensor(block_table, dtype=torch.int64)
    offsets = torch.arange(block_size, dtype=torch.int64)
    return (blocks[:, None] * block_size + offsets[None, :]).reshape(-1)[:length]  # (length,)


def paged_attention(q: torch.Tensor, cache: KVCache, ctx: BatchContext, scale: float,
                    sliding_window: int = 0) -> torch.Tensor:
    """q: (T, heads, head_dim) -> (T, heads, head_dim) on the kernel where it takes the dtypes, else the reference.
    The new tokens' K/V are already in `cache`; sliding_window W > 0: each query sees only its last W positions."""
    if q.dtype in _KERNEL_DTYPES and cache.key.dtype in _KERNEL_CACHE_DTYPES:
        q = q.contiguous()
        out = torch.empty_like(q)
        _C.paged_attention(q, cache.key, cache.value, *ctx.kernel_args, ctx.block_size, scale, out, sliding_window)
        return out
    return paged_attention_reference(q, cache, ctx, scale, sliding_window)


def paged_attention_reference(q: torch.Tensor, cache: KVCache, ctx: BatchContext, scale: float,
                              sliding_window: int = 0) -> torch.Tensor:
    """PyTorch version of `paged_attention`: SDPA over each sequence's visible keys read back from the cache."""
    out = torch.empty_like(q)
    start = 0
    for q_len, ctx_len, table in zip(ctx.query_lens, ctx.context_lens, ctx.block_tables):
        first, mask = visible_keys(q_len, ctx_len, sliding_window)  # mask: (q_len, keys)
        slots = _sequence_slots(table, ctx.block_size, ctx_len)[first:]
        k, v = (read_cache(t, slots, q.dtype).transpose(0, 1) for t in (cache.key, cache.value))  # (kv_heads, keys, d)
        qs = q[start:start + q_len].transpose(0, 1)  # (heads, q_len, head_dim)
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        out[start:start + q_len] = o.transpose(0, 1)
        start += q_len
    return out
