"""The int8 KV cache (--kv-cache-dtype int8): the row format, every attention variant, split-K decode,
the engine (compiled and eager, batching, chunking, preemption, prefix caching), the planner and flags.

Accuracy bounds, measured on this file's random data (x86, AVX-512 and scalar):
- against SDPA in float64 on the dequantized values: max error ~1e-6 (fp32 q), so 1e-5 / 2e-2 as the
  bf16 tests of test_attention.py;
- against SDPA on the original values (the int8 rounding itself, |k|,|v| ~ N(0, 1), head_dim 64/128):
  max error ~0.025, bound ATOL_VS_ORIGINAL = 0.06.
"""
from __future__ import annotations

import pytest
import torch

from shrike import _C
from shrike.cli import main
from shrike.engine.llm_engine import EngineConfig, LLMEngine
from shrike.errors import ConfigError
from shrike import kv_int8
from shrike.layers.attention import KVCache
from shrike.layers.kv_dtypes import resolve_kv_cache_dtype
from shrike.ops import rope_write_kv_reference
from shrike.platform.memory import plan_kv_cache
from shrike.sampling.params import SamplingParams
from paged_batch import paged_attention_reference, write_kv
from test_attention import make_batch, sdpa_float64

ATOL_VS_ORIGINAL = 0.06
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
# (query_lens, context_lens): decode, chunked prefill over a prefix, and long decode that is split by keys
# (contexts above 256 keys, with up to 8 new tokens).
SCENARIOS = {
    "decode": ([1, 1, 1, 1], [1, 17, 100, 1000]),
    "chunked_prefill": ([45, 20, 1], [300, 20, 33]),
    "split_k_decode": ([1, 3, 8], [2500, 1030, 4100]),
}


@pytest.fixture
def variants():
    before = _C.active_isa()
    yield list(_C.available_isas())
    _C.set_isa(before)


def int8_batch(query_lens, context_lens, heads, kv_heads, head_dim, q_dtype, seed=0, block_size=16):
    """make_batch's float32 batch with its cache quantized; unused rows get a NaN scale, so a read outside
    a sequence's keys poisons the output. Returns (q, cache, ctx, keys, values) with the original values."""
    q, cache, ctx, keys, values = make_batch(query_lens, context_lens, heads, kv_heads, head_dim, block_size,
                                             torch.float32, seed)
    int8 = KVCache(cache.key.shape[0] // block_size, block_size, kv_heads, head_dim, torch.int8)
    for src, dst in ((cache.key, int8.key), (cache.value, int8.value)):
        dst.copy_(kv_int8.quantize(torch.nan_to_num(src)))
        dst[..., head_dim:] = torch.full(src.shape[:2] + (1,), float("nan")).view(torch.int8)
    for k, v, slots in zip(keys, values, _sequence_slots(ctx)):
        write_kv(int8, slots, k, v)
    return q.to(q_dtype), int8, ctx, keys, values


def _sequence_slots(ctx):
    for table, length in zip(ctx.block_tables, ctx.context_lens):
        yield (torch.tensor(table)[:, None] * ctx.block_size + torch.arange(ctx.block_size)).reshape(-1)[:length]


def run_kernel(q, cache, ctx, scale):
    out = torch.empty_like(q)
    _C.paged_attention(q, cache.key, cache.value, *ctx.kernel_args, ctx.block_size, scale, out)
    return out


def test_row_format_round_trip():
    x = torch.randn(5, 3, 64) * torch.tensor([0.01, 1.0, 300.0])[None, :, None]
    x[0, 0] = 0  # an all-zero row has scale 0 and dequantizes to zeros
    rows = kv_int8.quantize(x)
    assert rows.dtype == torch.int8 and rows.shape == (5, 3, 68)
    back = kv_int8.dequantize(rows)
    assert torch.equal(back[0, 0], torch.zeros(64))
    step = x.abs().amax(-1, keepdim=True) / 127  # (5, 3, 1)
    assert ((back - x).abs() <= step / 2 * (1 + 1e-6)).all()
    assert rows[..., :64].abs().max() == 127


@pytest.mark.parametrize("act_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernel_write_matches_reference_bit_for_bit(act_dtype):
    gen = torch.Generator().manual_seed(3)
    tokens, heads, kv_heads, d = 7, 4, 2, 64
    qkv = (torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=gen) * 3).to(act_dtype)
    angles = torch.randn(tokens, d // 2, generator=gen)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    slots = torch.tensor([9, 0, 3, 15, 4, 11, 6])
    out = []
    for write in (_C.rope_write_kv, rope_write_kv_reference):
        q = torch.empty(tokens, heads, d, dtype=act_dtype)
        cache = KVCache(1, 16, kv_heads, d, torch.int8)
        cache.key.zero_(), cache.value.zero_()
        write(qkv, cos, sin, slots, q, cache.key, cache.value)
        out.append((q, cache.key, cache.value))
    for kernel, reference in zip(*out):
        assert torch.equal(kernel, reference)


SHAPES = [(4, 4, 64), (6, 2, 128), (16, 2, 128), (6, 2, 64)]  # (heads, kv_heads, head_dim): GQA 1, 3, 8


@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("scenario,heads,kv_heads,head_dim",
                         [(s, *shape) for s in SCENARIOS for shape in SHAPES[:2]] +
                         [(s, *shape) for s in SCENARIOS for shape in SHAPES[2:]][1::2])
def test_int8_attention_matches_sdpa(variants, scenario, heads, kv_heads, head_dim, q_dtype):
    q, cache, ctx, keys, values = int8_batch(*SCENARIOS[scenario], heads, kv_heads, head_dim, q_dtype)
    scale = head_dim ** -0.5
    dequantized = sdpa_float64(q, ctx, [kv_int8.dequantize(kv_int8.quantize(k)) for k in keys],
                               [kv_int8.dequantize(kv_int8.quantize(v)) for v in values], scale)
    original = sdpa_float64(q, ctx, keys, values, scale)
    tol = TOLERANCE[q_dtype]
    for isa in variants:
        _C.set_isa(isa)
        out = run_kernel(q, cache, ctx, scale).double()
        torch.testing.assert_close(out, dequantized, atol=tol, rtol=tol, msg=lambda m: f"{isa} vs dequantized: {m}")
        torch.testing.assert_close(out, original, atol=ATOL_VS_ORIGINAL, rtol=0, msg=lambda m: f"{isa} vs original: {m}")


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_value_path_of_every_variant_is_bit_exact(variants, scenario):
    """With q = 0 every attention weight is exactly 1 in every variant, so the output is the plain mean of
    the dequantized values, summed in key order: dequantization, accumulation and the split-K merge must
    then agree with the scalar reference bit for bit. (Scores and exp differ in the last bits between
    variants, as for the float caches; test_int8_attention_matches_sdpa bounds those.)"""
    q, cache, ctx, _, _ = int8_batch(*SCENARIOS[scenario], 16, 2, 128, torch.float32)
    q.zero_()
    _C.set_isa("scalar")
    reference = run_kernel(q, cache, ctx, 0.1)
    assert not reference.isnan().any()
    for isa in variants:
        _C.set_isa(isa)
        assert torch.equal(run_kernel(q, cache, ctx, 0.1), reference), isa


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_split_k_float_caches_match_sdpa(variants, dtype):
    q, cache, ctx, keys, values = make_batch([1, 4], [3000, 2100], 16, 2, 128, 16, dtype)
    expected = sdpa_float64(q, ctx, keys, values, 0.09)
    for isa in variants:
        _C.set_isa(isa)
        torch.testing.assert_close(run_kernel(q, cache, ctx, 0.09).double(), expected, atol=TOLERANCE[dtype],
                                   rtol=TOLERANCE[dtype], msg=lambda m: f"{isa}: {m}")


def test_eager_reference_path_reads_the_same_cache():
    q, cache, ctx, _, _ = int8_batch([5, 1, 12], [5, 40, 30], 9, 3, 64, torch.float32)
    torch.testing.assert_close(run_kernel(q, cache, ctx, 0.125), paged_attention_reference(q, cache, ctx, 0.125),
                               atol=1e-5, rtol=1e-5)


def test_bad_int8_cache_shape_is_refused():
    q, cache, ctx, _, _ = int8_batch([2], [20], 4, 2, 64, torch.float32)
    narrow = cache.key[..., :64].contiguous()
    with pytest.raises(ValueError, match="head_dim \\+ 4"):
        _C.paged_attention(q, narrow, narrow, *ctx.kernel_args, 16, 1.0, torch.empty_like(q))


# Planner and flags ------------------------------------------------------------------------------

def test_planner_counts_values_and_scales():
    kw = dict(num_layers=42, num_kv_heads=2, head_dim=128, block_size=16, max_model_len=32768, weight_bytes=0,
              kv_cache_space_gib=4.0, available_bytes=64 << 30)
    bf16 = plan_kv_cache(kv_dtype_bytes=2, **kw)
    int8 = plan_kv_cache(kv_dtype_bytes=1, kv_scale_bytes=4, **kw)
    assert bf16.bytes_per_token == 43008 and int8.bytes_per_token == 2 * 42 * 2 * 132 == 22176
    assert int8.max_concurrent_full_sequences == 5 and bf16.max_concurrent_full_sequences == 3


def test_unknown_kv_cache_dtype_is_a_one_line_error(capsys, default_model_dir):
    with pytest.raises(ConfigError, match="--kv-cache-dtype 'fp8' is not supported; use auto, bfloat16, float32, int8"):
        resolve_kv_cache_dtype("fp8", torch.bfloat16)
    assert main(["serve", "--kv-cache-dtype", "fp8_e4m3"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "shrike serve: error: --kv-cache-dtype 'fp8_e4m3' is not supported; use auto, bfloat16, float32, int8"]


def test_doctor_plans_an_int8_cache(default_model_dir, capsys):
    main(["doctor", str(default_model_dir), "--kv-cache-dtype", "int8", "--max-model-len", "2048"])
    out = capsys.readouterr().out
    # SmolLM2: 30 layers x 3 KV heads x (64 + 4) bytes x K and V
    assert "(int8)" in out and f"{2 * 30 * 3 * 68} bytes/token" in out


# Engine --------------------------------------------------------------------------------------------

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
TEXTS = ["The quick brown fox", "In 1492, Columbus sailed the ocean blue. Later that century, explorers from",
         "Water boils at", "A haiku about autumn leaves:\n"]


def make_engine(model_dir, **overrides) -> LLMEngine:
    config = dict(model=str(model_dir), max_model_len=256, progress=False, kv_cache_dtype="int8")
    config.update(overrides)
    return LLMEngine(EngineConfig(**config))


@pytest.fixture(scope="module")
def compiled(default_model_dir):
    """An int8-cache engine on the compiled forward, prefix caching on; each prompt run alone."""
    engine = make_engine(default_model_dir)
    assert engine.runner.compiled is not None and engine.runner.kv_caches[0].key.dtype == torch.int8
    prompts = [engine.tokenizer.encode(t) for t in TEXTS]
    return engine, prompts, [engine.generate([p], GREEDY)[0][0].token_ids for p in prompts]


@pytest.fixture(scope="module")
def eager(default_model_dir):
    """The eager Python forward, chunks of 7 tokens, no prefix caching."""
    return make_engine(default_model_dir, compiled_forward=False, max_num_batched_tokens=7,
                       enable_prefix_caching=False)


def test_eager_batched_chunked_run_equals_compiled_alone(compiled, eager):
    _, prompts, expected = compiled
    assert eager.runner.compiled is None
    assert [o[0].token_ids for o in eager.generate(prompts, GREEDY)] == expected


def test_preempted_run_equals_alone(default_model_dir, compiled):
    """Against each prompt alone with the same block size: the int8-cache attention rounds differently
    with blocks of 4 than of 16 (logits differ by up to 0.2 from the 5th token of TEXTS[0], with the lanes
    and the AMX tile dense orders alike), which can flip a near-tie."""
    engine, prompts, _ = compiled
    c = engine.model_config
    token_bytes = 2 * c.num_layers * c.num_kv_heads * kv_int8.row_bytes(c.head_dim)
    alone = make_engine(default_model_dir, block_size=4, max_model_len=48)
    expected = [alone.generate([p], GREEDY)[0][0].token_ids for p in prompts]
    tight = make_engine(default_model_dir, block_size=4, max_model_len=48,
                        kv_cache_space=14 * 4 * token_bytes / 2**30)  # 14 blocks of 4: not all fit at once
    assert [o[0].token_ids for o in tight.generate(prompts, GREEDY)] == expected
    assert tight.scheduler.num_preemptions > 0
    assert tight.block_manager.num_free_blocks == tight.block_manager.num_blocks


def test_prefix_cache_hit_gives_identical_output(compiled, eager):
    engine = compiled[0]
    system = engine.tokenizer.encode("You are a careful assistant who answers in one short sentence. " * 3)
    prompts = [system + engine.tokenizer.encode(q) for q in ("What is ice?", "Why is the sky blue?")]
    expected = [eager.generate([p], GREEDY)[0][0].token_ids for p in prompts]
    first = engine.generate([prompts[0]], GREEDY)[0][0].token_ids
    hits = engine.block_manager.prefix_hits
    second = engine.generate([prompts[1]], GREEDY)[0][0].token_ids
    assert engine.block_manager.prefix_hits - hits >= len(system) - engine.config.block_size
    assert [first, second] == expected


# Accuracy on SmolLM2 and a long prompt on a 2B-shaped model -------------------------------------------

# Measured (kernel path, chunks of 512 tokens), bf16 vs int8 cache, with (dense order, int8 attention walk) =
# (lanes, fp32) / (AMX tiles, fp32) / (AMX tiles, AMX tiles, the default at the amx level) / (lanes, int16 dots,
# the default at the avx512 levels since 2026-12-03):
#   public_domain_english.txt (2,236 tokens): +0.05% / -0.01% / -0.20% (18.1143 -> 18.0786) / +0.12% (18.0730 ->
#     18.0947), greedy agreement 96.4% / 95.7% / 96.3% / 95.8%
#   calibration_bill_of_rights.txt (609 tokens): +0.30% / +1.59% / +1.19% (5.4542 -> 5.5190) / +0.47% (5.4723 ->
#     5.4979), agreement 95.7% / 96.2% / 95.6% / 96.0%
# On the short text rounding alone moves the bf16-cache perplexity by up to 0.9% (the dense order: 5.4723 vs
# 5.4277; the attention walk: 5.4723 vs 5.4235; each changes one bf16 step on 0.02-0.3% of the elements), so its
# bound carries that noise; the long text keeps the bound.
# (The same bf16 weights computed in float32 agree with bf16 on 96.4%: test_quant_accuracy.py.)
MAX_PERPLEXITY_RATIO = {"public_domain_english.txt": 1.005,  # the bound: at most 0.5% worse
                        "calibration_bill_of_rights.txt": 1.02}
MIN_GREEDY_AGREEMENT = 0.93


@pytest.mark.parametrize("text", list(MAX_PERPLEXITY_RATIO))
def test_smollm2_perplexity_and_greedy_agreement(default_model_dir, text):
    from pathlib import Path

    from shrike.eval_ppl import evaluate_perplexity
    from shrike.model.loader import load_model

    loaded = load_model(str(default_model_dir), progress=False)
    ids = loaded.tokenizer.encode((Path(__file__).parent / "data" / text).read_text(), add_special_tokens=False)
    bf16, int8 = (evaluate_perplexity(loaded.model, ids, 512, kv) for kv in (torch.bfloat16, torch.int8))
    agreement = sum(a == b for a, b in zip(bf16.greedy_predictions, int8.greedy_predictions)) / bf16.scored_tokens
    print(f"{text}: perplexity {bf16.perplexity:.4f} -> {int8.perplexity:.4f}, agreement {agreement:.1%}")
    assert int8.perplexity <= MAX_PERPLEXITY_RATIO[text] * bf16.perplexity
    assert agreement >= MIN_GREEDY_AGREEMENT


def test_long_prompt_on_a_2b_shaped_model(tmp_path):
    """MiniCPM5-2B shapes (16 heads, 2 KV heads, head_dim 128, vocab 130,560) with 2 of its 42 layers: a
    32k-token prompt (the issue's context; its decode attention is split by keys) in 512-token chunks,
    int8 cache, then 4 decoded tokens."""
    from shrike.synth import synthesize

    synthesize(tmp_path / "m", "minicpm5-2b", "w4a8-g128", layers=2, progress=False)
    engine = LLMEngine(EngineConfig(model=str(tmp_path / "m"), max_model_len=32768, max_num_seqs=1,
                                    kv_cache_space=0.04, kv_cache_dtype="int8", progress=False))
    assert engine.runner.compiled is not None
    assert engine.kv_plan.bytes_per_token == 2 * 2 * 2 * 132
    prompt = [(i * 7919) % 20000 + 100 for i in range(32768 - 4)]
    out = engine.generate([prompt], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0][0]
    assert len(out.token_ids) == 4
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
