"""The int16-dot attention walk (csrc/attention/attention_int16_avx512vnni.cpp, bf16 queries over an int8 cache, both
products by vpdpwssd): bit for bit its scalar model (_C.paged_attention_int16_reference, attention_int16_ref.cpp,
which runs on any CPU), the model against SDPA in float64, and a token's output independent of how its sequence is
cut into steps and batched.

The walk quantizes each query row and each tile's softmax weights (times the value scales) to int16, 15
significant bits. Measured on this file's data (queries, keys and values N(0, 1) before the cache's int8
rounding; every scenario, GQA ratio, head_dim 64/128, block size 8/16/32), error against SDPA in float64 on the
dequantized cache, outputs rounded to bf16: max 0.0078, the bf16 rounding of the output itself, as the fp32 and
AMX walks. Bound: MODEL_ATOL = 0.025 (test_attention_amx.py's), no relative term.
"""
from __future__ import annotations

import pytest
import torch

from shrike import _C
from test_attention import make_batch, sdpa_float64
from test_attention_amx import HEADS, SCENARIOS, batch, one_sequence_steps, restore_isa, run  # noqa: F401 (fixture)

VNNI = "avx512vnni" in _C.available_isas()
needs_vnni = pytest.mark.skipif(not VNNI,
                                reason="avx512vnni: this CPU cannot run AVX-512 VNNI (the model is still tested)")
MODEL_ATOL = 0.025


def int16_kernel(*args):
    _C.set_isa("avx512vnni")
    _C.paged_attention(*args)


@needs_vnni
@pytest.mark.parametrize("heads,kv_heads", HEADS, ids=[f"gqa{h // kv}" for h, kv in HEADS])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_kernel_is_its_model_bit_for_bit(restore_isa, scenario, heads, kv_heads):
    for head_dim in (32, 64, 128, 256):
        for block_size in (8, 16, 32):  # tiles of 32 keys span 4, 2 and 1 cache blocks
            q, cache, ctx, _, _ = batch(scenario, heads, kv_heads, head_dim, block_size, "int8")
            want = run(_C.paged_attention_int16_reference, q, cache, ctx, head_dim ** -0.5)
            assert not want.isnan().any()
            got = run(int16_kernel, q, cache, ctx, head_dim ** -0.5)
            assert torch.equal(got, want), f"head_dim {head_dim}, block_size {block_size}: " \
                                           f"{(got != want).sum().item()} of {got.numel()} differ"


@pytest.mark.parametrize("heads,kv_heads", HEADS, ids=[f"gqa{h // kv}" for h, kv in HEADS])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_model_matches_sdpa(scenario, heads, kv_heads):
    for head_dim in (64, 128):
        q, cache, ctx, keys, values = batch(scenario, heads, kv_heads, head_dim, 16, "int8")
        expected = sdpa_float64(q, ctx, keys, values, head_dim ** -0.5)
        got = run(_C.paged_attention_int16_reference, q, cache, ctx, head_dim ** -0.5)
        torch.testing.assert_close(got.double(), expected, atol=MODEL_ATOL, rtol=0, msg=lambda m: f"D{head_dim}: {m}")


@pytest.mark.parametrize("window", [1, 7, 40, 300])  # inside a tile, across tiles and blocks, wider than some contexts
@pytest.mark.parametrize("scenario", ["decode_mixed_context", "chunked_prefill_over_prefix", "prefill_300"])
def test_sliding_window_kernel_and_model(restore_isa, scenario, window):
    for head_dim, block_size in ((64, 16), (128, 32)):
        q, cache, ctx, keys, values = batch(scenario, 8, 2, head_dim, block_size, "int8")
        expected = sdpa_float64(q, ctx, keys, values, 0.1, window)
        want = run(_C.paged_attention_int16_reference, q, cache, ctx, 0.1, window)
        torch.testing.assert_close(want.double(), expected, atol=MODEL_ATOL, rtol=0)
        if VNNI:
            assert torch.equal(run(int16_kernel, q, cache, ctx, 0.1, window), want)


def test_extreme_scales_stay_finite(restore_isa):
    """A zero query row, all-zero value rows (scale 0) and very large and very small rows: no NaN, no overflow."""
    q, cache, ctx, keys, values = batch(([3, 1], [40, 300]), 8, 2, 64, 16, "int8")
    q[0].zero_()
    for part in (cache.key, cache.value):
        rows = part.view(-1, 2, 68)
        rows[5:9, :, :64] = 0
        rows[5:9, :, 64:] = torch.zeros(4, 2, 1).view(torch.int8)  # scale 0
        rows[20:30, :, 64:] = torch.full((10, 2, 1), 1e30).view(torch.int8)
        rows[30:40, :, 64:] = torch.full((10, 2, 1), 1e-30).view(torch.int8)
    want = run(_C.paged_attention_int16_reference, q, cache, ctx, 0.125)
    assert torch.isfinite(want.float()).all()
    if VNNI:
        assert torch.equal(run(int16_kernel, q, cache, ctx, 0.125), want)


@pytest.mark.parametrize("window", [0, 40])
@pytest.mark.parametrize("fn", ["kernel", "model"])
def test_a_token_gets_the_same_bits_however_its_sequence_is_stepped(restore_isa, fn, window):
    """Prefill, chunked prefill, speculative verification and decode, alone or batched with other sequences:
    each row's arithmetic depends only on its own query and the keys it sees (split-K decode, <= 8 new tokens over > 256 keys, is kept out: the short steps come before key 256)."""
    if fn == "kernel" and not VNNI:
        pytest.skip("avx512vnni: this CPU cannot run AVX-512 VNNI")
    attend = int16_kernel if fn == "kernel" else _C.paged_attention_int16_reference
    heads, head_dim = (16, 128) if fn == "kernel" else (8, 64)
    length, steps = 600, [[600], [200, 250, 150], [240, 3, 1, 1, 5, 350], [1, 31, 100, 468]]
    q, cache, ctx, _, _ = batch(([length], [length]), heads, 2, head_dim, 16, "int8", seed=length)
    whole = one_sequence_steps(q, cache, ctx, steps[0], 0.09, window, attend)
    for cut in steps[1:]:
        assert torch.equal(one_sequence_steps(q, cache, ctx, cut, 0.09, window, attend), whole), cut


@needs_vnni
def test_walk_is_chosen_only_for_bf16_queries_over_int8(restore_isa):
    _C.set_isa("avx512vnni")
    assert _C.attention_variant("bfloat16", "int8", 128) == "avx512vnni-int16"
    assert _C.attention_variant("bfloat16", "int8", 48) == "avx512vnni"  # head_dim % 32 != 0: the fp32 walk
    assert _C.attention_variant("bfloat16", "int8", 512) == "avx512vnni"  # the int32 dot could overflow
    assert _C.attention_variant("float32", "int8", 128) == "avx512vnni"
    assert _C.attention_variant("bfloat16", "bfloat16", 128) == "avx2"
    with pytest.raises(ValueError, match="int16-dot walk takes bf16 queries"):
        q, cache, ctx, _, _ = make_batch([3], [40], 4, 2, 64, 16, torch.bfloat16)
        run(_C.paged_attention_int16_reference, q, cache, ctx, 0.125)
