"""Paged attention kernel (every compiled variant this CPU runs) against torch SDPA in float64."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shrike import _C
from shrike.layers.attention import KVCache
from paged_batch import BatchContext, paged_attention, paged_attention_reference

# name -> (query_lens, context_lens); query i of a sequence sits at position context - query_len + i
SCENARIOS = {
    "decode_mixed_context": ([1, 1, 1, 1], [1, 17, 100, 1000]),
    "prefill_from_empty": ([37, 64], [37, 64]),
    "chunked_prefill_over_prefix": ([45, 20, 1], [300, 20, 33]),
}
HEADS = [(4, 4), (6, 2), (8, 1)]  # (query heads, KV heads): GQA ratios 1, 3, 8
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.fixture
def variants():
    """The variants to run; the active one is restored afterwards."""
    before = _C.active_isa()
    yield list(_C.available_isas())
    _C.set_isa(before)


def make_batch(query_lens, context_lens, heads, kv_heads, head_dim, block_size, dtype, seed=0):
    """A paged cache holding the sequences' keys in shuffled blocks, the rest of it NaN, so that a
    read outside a sequence's visible keys poisons the output. Returns (q, cache, ctx, keys, values)."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-c // block_size) for c in context_lens]
    num_blocks = sum(blocks_per_seq) + 3
    cache = KVCache(num_blocks, block_size, kv_heads, head_dim, dtype)
    cache.key.fill_(float("nan"))
    cache.value.fill_(float("nan"))
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables, keys, values, slots = [], [], [], []
    for n_blocks, length in zip(blocks_per_seq, context_lens):
        table, order = order[:n_blocks], order[n_blocks:]
        tables.append(table)
        seq_slots = (torch.tensor(table)[:, None] * block_size + torch.arange(block_size)).reshape(-1)[:length]
        k = torch.randn(length, kv_heads, head_dim, generator=gen).to(dtype)  # (length, kv_heads, head_dim)
        v = torch.randn(length, kv_heads, head_dim, generator=gen).to(dtype)
        cache.key[seq_slots], cache.value[seq_slots] = k, v
        keys.append(k), values.append(v), slots.append(seq_slots)
    q = torch.randn(sum(query_lens), heads, head_dim, generator=gen).to(dtype)  # (T, heads, head_dim)
    positions = torch.cat([torch.arange(c - n, c) for n, c in zip(query_lens, context_lens)])
    new_slots = torch.cat([s[c - n:] for s, n, c in zip(slots, query_lens, context_lens)])
    ctx = BatchContext(positions=positions, slot_mapping=new_slots, query_lens=list(query_lens),
                       context_lens=list(context_lens), block_tables=tables, block_size=block_size)
    return q, cache, ctx, keys, values


def sdpa_float64(q, ctx, keys, values, scale, window=0):
    out, start = [], 0
    for n, c, k, v in zip(ctx.query_lens, ctx.context_lens, keys, values):
        qs = q[start:start + n].double().transpose(0, 1)  # (heads, n, head_dim)
        key_pos, q_pos = torch.arange(c)[None, :], torch.arange(c - n, c)[:, None]
        mask = (key_pos <= q_pos) & ((key_pos > q_pos - window) if window else True)  # (n, c)
        o = F.scaled_dot_product_attention(qs, k.double().transpose(0, 1), v.double().transpose(0, 1),
                                           attn_mask=mask, scale=scale, enable_gqa=True)
        out.append(o.transpose(0, 1))
        start += n
    return torch.cat(out)  # (T, heads, head_dim)


def run_kernel(q, cache, ctx, scale):
    out = torch.empty_like(q)
    _C.paged_attention(q, cache.key, cache.value, *ctx.kernel_args, ctx.block_size, scale, out)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads,kv_heads", HEADS, ids=[f"gqa{h // kv}" for h, kv in HEADS])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_kernel_matches_sdpa(variants, scenario, heads, kv_heads, head_dim, block_size, dtype):
    query_lens, context_lens = SCENARIOS[scenario]
    q, cache, ctx, keys, values = make_batch(query_lens, context_lens, heads, kv_heads, head_dim, block_size, dtype)
    scale = head_dim ** -0.5
    expected = sdpa_float64(q, ctx, keys, values, scale)
    tol = TOLERANCE[dtype]
    for isa in variants:
        _C.set_isa(isa)
        out = run_kernel(q, cache, ctx, scale)
        torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol, msg=lambda m: f"{isa}: {m}")


@pytest.mark.parametrize("head_dim", [8, 36, 80, 200])  # tails of every vector loop; 36 is scalar-only on AVX2
def test_odd_head_dims(variants, head_dim):
    q, cache, ctx, keys, values = make_batch([1, 50], [70, 50], 6, 2, head_dim, 16, torch.float32)
    expected = sdpa_float64(q, ctx, keys, values, 0.3)
    for isa in variants:
        _C.set_isa(isa)
        torch.testing.assert_close(run_kernel(q, cache, ctx, 0.3).double(), expected, atol=1e-5, rtol=1e-5,
                                   msg=lambda m: f"{isa}: {m}")


@pytest.mark.parametrize("q_dtype,cache_dtype", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)])
def test_mixed_dtypes(variants, q_dtype, cache_dtype):
    q, cache, ctx, keys, values = make_batch([3, 1], [40, 9], 4, 2, 64, 16, cache_dtype)
    q = q.to(q_dtype)
    expected = sdpa_float64(q, ctx, keys, values, 0.125)
    for isa in variants:
        _C.set_isa(isa)
        out = run_kernel(q, cache, ctx, 0.125)
        assert out.dtype == q_dtype
        torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2, msg=lambda m: f"{isa}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_layer_entry_point_uses_kernel_like_reference(dtype):
    q, cache, ctx, _, _ = make_batch([5, 1, 12], [5, 40, 30], 9, 3, 64, 16, dtype)
    q = q.transpose(0, 1).contiguous().transpose(0, 1)  # same values, not contiguous: the layer copies
    out = paged_attention(q, cache, ctx, 0.125)
    torch.testing.assert_close(out, paged_attention_reference(q, cache, ctx, 0.125),
                               atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    assert ctx.kernel_args is ctx.kernel_args  # built once per step, shared by the layers


def poison_outside_windows(cache, ctx, window):
    """NaN into every cached position older than all of its sequence's query windows, as if its block
    had been handed to another sequence: reading one would poison the output."""
    for n, c, table in zip(ctx.query_lens, ctx.context_lens, ctx.block_tables):
        slots = (torch.tensor(table)[:, None] * ctx.block_size + torch.arange(ctx.block_size)).reshape(-1)
        oldest_seen = max(0, c - n - window + 1)
        cache.key[slots[:oldest_seen]] = float("nan")
        cache.value[slots[:oldest_seen]] = float("nan")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("window", [1, 7, 40])  # inside one tile, across tiles and blocks
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_sliding_window_matches_sdpa_and_reads_only_the_window(variants, scenario, window, dtype):
    query_lens, context_lens = SCENARIOS[scenario]
    q, cache, ctx, keys, values = make_batch(query_lens, context_lens, 8, 2, 64, 16, dtype)
    expected = sdpa_float64(q, ctx, keys, values, 0.125, window)
    poison_outside_windows(cache, ctx, window)
    tol = TOLERANCE[dtype]
    for isa in variants:
        _C.set_isa(isa)
        out = torch.empty_like(q)
        _C.paged_attention(q, cache.key, cache.value, *ctx.kernel_args, ctx.block_size, 0.125, out, window)
        torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol, msg=lambda m: f"{isa}: {m}")
    torch.testing.assert_close(paged_attention_reference(q, cache, ctx, 0.125, window).double(), expected,
                               atol=tol, rtol=tol)


def test_window_wider_than_every_context_is_bit_identical_to_none(variants):
    q, cache, ctx, _, _ = make_batch([45, 20, 1], [300, 20, 33], 8, 2, 64, 16, torch.float32)
    for isa in variants:
        _C.set_isa(isa)
        assert torch.equal(run_kernel(q, cache, ctx, 0.125), paged_attention(q, cache, ctx, 0.125, sliding_window=300))


def test_bad_arguments_raise():
    q, cache, ctx, _, _ = make_batch([2], [20], 4, 2, 64, 16, torch.float32)
    tables, query_start, context_lens = ctx.kernel_args
    out = torch.empty_like(q)
    with pytest.raises(ValueError, match="uses block"):
        bad = tables.clone()
        bad[0, 1] = cache.key.shape[0] // 16
        _C.paged_attention(q, cache.key, cache.value, bad, query_start, context_lens, 16, 1.0, out)
    with pytest.raises(ValueError, match="new tokens but context length"):
        _C.paged_attention(q, cache.key, cache.value, tables, query_start, torch.tensor([1], dtype=torch.int32),
                           16, 1.0, out)
    with pytest.raises(ValueError, match="multiple of the KV heads"):
        q3 = torch.randn(2, 3, 64)
        _C.paged_attention(q3, cache.key, cache.value, tables, query_start, context_lens, 16, 1.0, torch.empty_like(q3))
    with pytest.raises(ValueError, match="sliding_window must be 0"):
        _C.paged_attention(q, cache.key, cache.value, tables, query_start, context_lens, 16, 1.0, out, -1)
    with pytest.raises(TypeError, match="int32"):
        _C.paged_attention(q, cache.key, cache.value, tables.long(), query_start, context_lens, 16, 1.0, out)
    with pytest.raises(ValueError, match="contiguous"):
        _C.paged_attention(q, cache.key, cache.value, tables, query_start, context_lens, 16, 1.0,
                           torch.empty(64, 4, 2).transpose(0, 2))
