"""The AMX-BF16 attention walk (csrc/attention/attention_amx.cpp, bf16 queries over a bf16 or int8 cache): bit for
bit its scalar model (_C.paged_attention_amx_reference, attention_amx_ref.cpp, which runs on any CPU), the model
against SDPA in float64, and a token's output independent of how its sequence is cut into steps and batched.

The walk carries P (the softmax weights, times the value's scale for int8) as two bf16 terms, 16 significant
bits. Measured on this file's data (queries, keys and values N(0, 1), outputs rounded to bf16; every scenario,
GQA ratio, head_dim 64/128, block size 16/32), error against SDPA in float64, max (mean): bf16 cache 0.0078
(0.00018), int8 cache against SDPA on the dequantized values 0.0078 (0.00023): the fp32 walk's, which is also
SDPA's own result rounded to bf16. (One bf16 term for P gave 0.0094 (0.00024) and 0.0101 (0.00032).)
Bound: MODEL_ATOL = 0.025, no relative term.
On SmolLM2-135M's attention inputs the outputs equal the fp32 walk's on 99.7% of the elements (the rest one
bf16 step apart), yet the model's near-ties move: perplexity changes by -0.9% .. +0.5% and the greedy
predictions agree with the fp32 walk's on 95.6-97.4% of the tokens (test_smollm2_against_the_fp32_walk; the
model's bf16 and fp32 forwards agree on 96.4%, test_quant_accuracy.py).
"""
from __future__ import annotations

import pytest
import torch

from pathlib import Path

from shrike import _C
from shrike import kv_int8
from test_attention import make_batch, poison_outside_windows, sdpa_float64
from test_kv_int8 import int8_batch

AMX = "amx" in _C.available_isas()
needs_amx = pytest.mark.skipif(not AMX, reason="amx: this CPU cannot run AMX-BF16 (the model is still tested)")
MODEL_ATOL = 0.025

# name -> (query_lens, context_lens). Query i of a sequence sits at position context - query_len + i.
SCENARIOS = {
    "decode_mixed_context": ([1, 1, 1, 1], [1, 17, 100, 1000]),
    "prefill_from_empty": ([37, 64], [37, 64]),
    "chunked_prefill_over_prefix": ([45, 20, 1], [300, 20, 33]),
    "prefill_300": ([300], [300]),
    "items_of_several_row_chunks": ([130, 7], [1300, 7]),  # 130 rows at gqa1: two chunks of 128 rows
    "split_k_decode_and_verify": ([1, 5, 8], [2500, 1100, 2049]),  # split by keys (<= 8 new tokens, > 256 keys)
}
HEADS = [(4, 4), (6, 2), (16, 2)]  # GQA 1, 3, 8


def batch(scenario, heads, kv_heads, head_dim, block_size, kv, seed=0):
    """(q, cache, ctx, keys, values): bf16 queries over a bf16 or an int8 cache (keys, values as the cache holds them)."""
    query_lens, context_lens = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
    if kv == "bf16":
        return make_batch(query_lens, context_lens, heads, kv_heads, head_dim, block_size, torch.bfloat16, seed)
    q, cache, ctx, keys, values = int8_batch(query_lens, context_lens, heads, kv_heads, head_dim, torch.bfloat16, seed,
                                             block_size)
    stored = [kv_int8.dequantize(kv_int8.quantize(t)) for t in keys], [kv_int8.dequantize(kv_int8.quantize(t)) for t in values]
    return q, cache, ctx, *stored


def run(fn, q, cache, ctx, scale, window=0):
    out = torch.empty_like(q)
    fn(q, cache.key, cache.value, *ctx.kernel_args, ctx.block_size, scale, out, window)
    return out


def amx_kernel(*args):
    _C.set_isa("amx")
    _C.paged_attention(*args)


@pytest.fixture
def restore_isa():
    before = _C.active_isa()
    yield
    _C.set_isa(before)


@needs_amx
@pytest.mark.parametrize("kv", ["bf16", "int8"])
@pytest.mark.parametrize("heads,kv_heads", HEADS, ids=[f"gqa{h // kv}" for h, kv in HEADS])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_amx_kernel_is_its_model_bit_for_bit(restore_isa, scenario, heads, kv_heads, kv):
    for head_dim in (64, 128):
        for block_size in (8, 16, 32):  # 8: sub-tiles cross cache blocks and are gathered
            q, cache, ctx, _, _ = batch(scenario, heads, kv_heads, head_dim, block_size, kv)
            want = run(_C.paged_attention_amx_reference, q, cache, ctx, head_dim ** -0.5)
            assert not want.isnan().any()
            got = run(amx_kernel, q, cache, ctx, head_dim ** -0.5)
            assert torch.equal(got, want), f"head_dim {head_dim}, block_size {block_size}: " \
                                           f"{(got != want).sum().item()} of {got.numel()} differ"


@pytest.mark.parametrize("kv", ["bf16", "int8"])
@pytest.mark.parametrize("window", [1, 7, 40, 300])  # inside a tile, across tiles and blocks, wider than some contexts
@pytest.mark.parametrize("scenario", ["decode_mixed_context", "chunked_prefill_over_prefix", "prefill_300"])
def test_sliding_window_kernel_and_model(restore_isa, scenario, window, kv):
    for head_dim, block_size in ((64, 16), (128, 32)):
        q, cache, ctx, keys, values = batch(scenario, 8, 2, head_dim, block_size, kv)
        expected = sdpa_float64(q, ctx, keys, values, 0.1, window)
        if kv == "bf16":  # reading a key older than every window would poison the output
            poison_outside_windows(cache, ctx, window)
        want = run(_C.paged_attention_amx_reference, q, cache, ctx, 0.1, window)
        torch.testing.assert_close(want.double(), expected, atol=MODEL_ATOL, rtol=0)
        if AMX:
            assert torch.equal(run(amx_kernel, q, cache, ctx, 0.1, window), want)


@pytest.mark.parametrize("kv", ["bf16", "int8"])
@pytest.mark.parametrize("heads,kv_heads", HEADS, ids=[f"gqa{h // kv}" for h, kv in HEADS])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_model_matches_sdpa(scenario, heads, kv_heads, kv):
    for head_dim in (64, 128):
        q, cache, ctx, keys, values = batch(scenario, heads, kv_heads, head_dim, 16, kv)
        expected = sdpa_float64(q, ctx, keys, values, head_dim ** -0.5)
        got = run(_C.paged_attention_amx_reference, q, cache, ctx, head_dim ** -0.5)
        torch.testing.assert_close(got.double(), expected, atol=MODEL_ATOL, rtol=0, msg=lambda m: f"D{head_dim}: {m}")


def one_sequence_steps(q, cache, ctx, steps, scale, window, fn):
    """The rows of `q` (one sequence whose tokens are all new) computed in `steps`: new-token counts, one call
    each, each step seeing the tokens before it."""
    out, done = [], 0
    table = ctx.kernel_args[0]
    for n in steps:
        done += n
        qs = q[done - n:done]
        o = torch.empty_like(qs)
        fn(qs, cache.key, cache.value, table, torch.tensor([0, n], dtype=torch.int32),
           torch.tensor([done], dtype=torch.int32), ctx.block_size, scale, o, window)
        out.append(o)
    return torch.cat(out)


@pytest.mark.parametrize("window", [0, 40])
@pytest.mark.parametrize("kv", ["bf16", "int8"])
@pytest.mark.parametrize("fn", ["kernel", "model"])
def test_a_token_gets_the_same_bits_however_its_sequence_is_stepped(restore_isa, fn, kv, window):
    """Prefill, chunked prefill, speculative verification and decode, alone or batched with other sequences:
    each row's arithmetic depends only on its own query and the keys it sees (split-K decode, <= 8 new tokens
    over > 256 keys, is the one exception, and is kept out of this test: its short steps come before key 256)."""
    if fn == "kernel" and not AMX:
        pytest.skip("amx: this CPU cannot run AMX-BF16")
    attend = amx_kernel if fn == "kernel" else _C.paged_attention_amx_reference
    cuts = [(600, [[600], [200, 250, 150], [240, 3, 1, 1, 5, 350], [1, 31, 100, 468]])]
    if fn == "kernel":  # (the scalar model is slow)
        cuts.append((1500, [[1500], [700, 800], [1480, 9, 11]]))
    heads, head_dim = (16, 128) if fn == "kernel" else (8, 64)
    for length, steps in cuts:
        q, cache, ctx, _, _ = batch(([length], [length]), heads, 2, head_dim, 16, kv, seed=length)
        whole = one_sequence_steps(q, cache, ctx, steps[0], 0.09, window, attend)
        for cut in steps[1:]:
            assert torch.equal(one_sequence_steps(q, cache, ctx, cut, 0.09, window, attend), whole), cut
        # The last 150 tokens as one sequence of a batch with two others (its blocks first in the cache).
        other_q, other_cache, other_ctx, _, _ = batch(([20, 1], [50, 300]), heads, 2, head_dim, 16, kv, seed=1)
        key = torch.cat([cache.key, other_cache.key])
        value = torch.cat([cache.value, other_cache.value])
        offset = cache.key.shape[0] // 16
        tables = [ctx.block_tables[0]] + [[b + offset for b in t] for t in other_ctx.block_tables]
        width = max(len(t) for t in tables)
        tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        batched_q = torch.cat([q[-150:], other_q])
        out = torch.empty_like(batched_q)
        attend(batched_q, key, value, tables, torch.tensor([0, 150, 170, 171], dtype=torch.int32),
               torch.tensor([length, 50, 300], dtype=torch.int32), 16, 0.09, out, window)
        assert torch.equal(out[:150], whole[-150:])


@needs_amx
def test_amx_is_chosen_only_for_bf16_queries_over_bf16_or_int8_and_head_dim_multiple_of_32(restore_isa):
    """fp32 queries or caches and other head dims keep the fp32 walks (equal to the avx512bf16 level's)."""
    for dtype, head_dim in ((torch.float32, 64), (torch.bfloat16, 48)):
        q, cache, ctx, _, _ = make_batch([3, 1], [40, 9], 4, 2, head_dim, 16, dtype)
        _C.set_isa("avx512bf16")
        below = run(_C.paged_attention, q, cache, ctx, 0.125)
        assert torch.equal(run(amx_kernel, q, cache, ctx, 0.125), below)
    with pytest.raises(ValueError, match="AMX walk takes bf16 queries"):
        q, cache, ctx, _, _ = make_batch([3], [40], 4, 2, 48, 16, torch.bfloat16)
        run(_C.paged_attention_amx_reference, q, cache, ctx, 0.125)


# Measured (chunks of 512 tokens), avx512bf16 level (fp32 walk, lanes-order dense) -> amx level (AMX walk,
# tile-order dense), and greedy agreement between the two:
#   public_domain_english.txt: bf16 cache 18.0730 -> 18.1143 (+0.23%, 97.8%), int8 18.0814 -> 18.0786 (-0.02%, 95.8%)
#   calibration_bill_of_rights.txt: bf16 cache 5.4723 -> 5.4542 (-0.33%, 96.7%), int8 5.4887 -> 5.5190 (+0.55%, 94.9%)
# (the AMX walk alone, on lanes-order dense: +0.45% / -0.06% and -0.89% / +0.04%)
MAX_PERPLEXITY_CHANGE = 0.015
MIN_GREEDY_AGREEMENT = 0.94


@needs_amx
@pytest.mark.parametrize("text", ["public_domain_english.txt", "calibration_bill_of_rights.txt"])
def test_smollm2_against_the_fp32_walk(default_model_dir, restore_isa, text):
    """The model loaded and run at each level, as a user on each CPU gets it: at avx512bf16 the fp32 walk and the
    lanes-order dense kernel, at amx the AMX walk and the tile-order dense kernel on weights packed at load."""
    from shrike.eval_ppl import evaluate_perplexity
    from shrike.model.loader import load_model

    ids = None
    for kv in (torch.bfloat16, torch.int8):
        results = {}
        for isa in ("avx512bf16", "amx"):
            _C.set_isa(isa)
            loaded = load_model(str(default_model_dir), progress=False)
            if ids is None:
                ids = loaded.tokenizer.encode((Path(__file__).parent / "data" / text).read_text(),
                                              add_special_tokens=False)
            results[isa] = evaluate_perplexity(loaded.model, ids, 512, kv)
        walk, amx = results["avx512bf16"], results["amx"]
        agreement = sum(a == b for a, b in zip(walk.greedy_predictions, amx.greedy_predictions)) / walk.scored_tokens
        print(f"{text}, {kv} cache: perplexity {walk.perplexity:.4f} -> {amx.perplexity:.4f}, agreement {agreement:.1%}")
        assert abs(amx.perplexity / walk.perplexity - 1) <= MAX_PERPLEXITY_CHANGE
        assert agreement >= MIN_GREEDY_AGREEMENT


@needs_amx
def test_variant_names_follow_the_level():
    level = _C.active_isa()
    try:
        _C.set_isa("amx")
        assert _C.attention_variant("bfloat16", "bfloat16", 128) == "amx"
        assert _C.attention_variant("bfloat16", "int8", 64) == "amx"
        assert _C.attention_variant("bfloat16", "bfloat16", 80) == "avx2"  # head_dim % 32 != 0: no tiles
        assert _C.attention_variant("float32", "float32", 128) == "avx2"
        assert _C.attention_variant("float32", "int8", 128) == "avx512vnni"
        _C.set_isa("avx2")
        assert _C.attention_variant("bfloat16", "int8", 128) == "avx2"
        _C.set_isa("scalar")
        assert _C.attention_variant("bfloat16", "bfloat16", 128) == "scalar"
    finally:
        _C.set_isa(level)
