"""Batched, chunked and preempted runs give the same greedy tokens as each request alone,
and every KV block returns to the pool afterwards."""
from __future__ import annotations

import pytest

from shrike.engine.llm_engine import EngineConfig, LLMEngine
from shrike.sampling.params import SamplingParams

TEXTS = [
    "The quick brown fox",
    "In 1492, Columbus sailed the ocean blue. Later that century, explorers from many countries",
    "Water boils at",
    "A haiku about autumn leaves:\n",
    "The three primary colors are red, yellow and blue. Mixing red and blue gives purple; mixing",
]
GREEDY = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)


def make_engine(model_dir, **overrides) -> LLMEngine:
    config = dict(model=str(model_dir), dtype="float32", max_model_len=256, progress=False)
    config.update(overrides)
    return LLMEngine(EngineConfig(**config))


@pytest.fixture(scope="module")
def alone(default_model_dir):
    engine = make_engine(default_model_dir)
    prompts = [engine.tokenizer.encode(t) for t in TEXTS]
    return prompts, [engine.generate([p], GREEDY)[0][0].token_ids for p in prompts]


def _check_all_blocks_free(engine: LLMEngine):
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert not engine.scheduler.running and not engine.scheduler.waiting


def test_batched_equals_alone(default_model_dir, alone):
    prompts, expected = alone
    engine = make_engine(default_model_dir)
    outputs = engine.generate(prompts, GREEDY)
    assert [o[0].token_ids for o in outputs] == expected
    _check_all_blocks_free(engine)


def test_chunked_prefill_equals_alone(default_model_dir, alone):
    prompts, expected = alone
    engine = make_engine(default_model_dir, max_num_batched_tokens=7)
    outputs = engine.generate(prompts, GREEDY)
    assert [o[0].token_ids for o in outputs] == expected
    _check_all_blocks_free(engine)


def test_preemption_equals_alone(default_model_dir, alone):
    prompts, expected = alone
    # 16 blocks x 4 tokens = 64 slots: five sequences of ~20-40 tokens cannot all stay resident.
    engine = make_engine(default_model_dir, block_size=4, kv_cache_space=_gib_for_blocks(default_model_dir, 16, 4),
                         max_model_len=64)
    outputs = engine.generate(prompts, GREEDY)
    assert engine.scheduler.num_preemptions > 0
    assert [o[0].token_ids for o in outputs] == expected
    _check_all_blocks_free(engine)


def test_abort_returns_blocks(default_model_dir, alone):
    prompts, _ = alone
    engine = make_engine(default_model_dir)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, GREEDY)
    engine.step()
    engine.step()
    for i in range(len(prompts)):
        engine.abort(f"r{i}")
    _check_all_blocks_free(engine)


def test_request_that_can_never_fit_is_rejected(default_model_dir):
    engine = make_engine(default_model_dir, max_model_len=32)
    with pytest.raises(ValueError, match="maximum context length is 32"):
        engine.add_request("long", list(range(100, 140)), GREEDY)
    with pytest.raises(ValueError, match="max_tokens"):
        engine.add_request("long-output", [1, 2, 3], SamplingParams(max_tokens=100))


def _gib_for_blocks(model_dir, blocks: int, block_size: int) -> float:
    from shrike.model.config import ModelConfig
    c = ModelConfig.from_dir(model_dir)
    bytes_per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4
    return blocks * block_size * bytes_per_token / 2**30


def test_prefix_cache_hit_gives_identical_output(default_model_dir):
    engine = make_engine(default_model_dir, block_size=4)
    tok = engine.tokenizer
    system = "You are a careful assistant who answers in one short sentence. " * 3
    prompts = [tok.encode(system + q) for q in ("What is ice?", "Why is the sky blue?")]
    cold = make_engine(default_model_dir, block_size=4, enable_prefix_caching=False)
    expected = [cold.generate([p], GREEDY)[0][0].token_ids for p in prompts]
    first = engine.generate([prompts[0]], GREEDY)[0][0].token_ids
    hits_before = engine.block_manager.prefix_hits
    second = engine.generate([prompts[1]], GREEDY)[0][0].token_ids
    shared = engine.block_manager.prefix_hits - hits_before
    assert shared >= len(tok.encode(system)) - 2 * engine.config.block_size  # the system prompt came from the cache
    again = engine.generate([prompts[0]], GREEDY)[0][0].token_ids  # a full-prompt hit but for its last token
    assert [first, second, again] == [expected[0], expected[1], expected[0]]
    _check_all_blocks_free(engine)


def test_cached_blocks_are_evicted_when_space_is_needed(default_model_dir, alone):
    prompts, expected = alone
    engine = make_engine(default_model_dir, block_size=4, kv_cache_space=_gib_for_blocks(default_model_dir, 16, 4),
                         max_model_len=64)
    for prompt, want in zip(prompts, expected):  # each run leaves its blocks cached, the next evicts them
        assert engine.generate([prompt], GREEDY)[0][0].token_ids == want
    _check_all_blocks_free(engine)
