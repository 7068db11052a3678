"""Speculative decoding (n-gram prompt lookup) gives token for token what plain greedy decoding gives,
alone, batched with non-speculating rows, with prefix-cache hits and with preemption, and every KV block
returns to the pool after the rollbacks of rejected proposals."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from test_engine_batching import _gib_for_blocks

from shrike.engine.llm_engine import EngineConfig, LLMEngine
from shrike.sampling.params import SamplingParams
from shrike.speculative.speculator import SpecStats

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
PASSAGE = ("The lighthouse keeper climbed the spiral stairs every evening at dusk. He wound the clockwork, "
           "trimmed the wick and polished the great lens until it shone.")
TEXTS = [
    f"Copy this text exactly.\nText: {PASSAGE}\nCopy: {PASSAGE[:60]}",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n",
    "one two three four, one two three four, one two three four, one two",
    "The quick brown fox",
    "Water boils at",
    "A haiku about autumn leaves:\n",
]
GREEDY = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)


def make_engine(model_dir, speculative: bool, **overrides) -> LLMEngine:
    config = {"model": str(model_dir), "dtype": "float32", "max_model_len": 256, "progress": False,
              "speculative_config": NGRAM if speculative else None}
    config.update(overrides)
    return LLMEngine(EngineConfig(**config))


@pytest.fixture(scope="module")
def plain_engine(default_model_dir):
    return make_engine(default_model_dir, speculative=False)


@pytest.fixture(scope="module")
def spec_engine(default_model_dir):
    """Shared by the tests below: each leaves every block back in the pool."""
    return make_engine(default_model_dir, speculative=True)


@pytest.fixture(scope="module")
def plain(plain_engine):
    prompts = [plain_engine.tokenizer.encode(t) for t in TEXTS]
    return prompts, [plain_engine.generate([p], GREEDY)[0][0].token_ids for p in prompts]


def _check_all_blocks_free(engine: LLMEngine):
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert not engine.scheduler.running and not engine.scheduler.waiting


def _check_speculated(engine: LLMEngine, before: SpecStats):
    """Since `before` (a copy of the engine's figures), some proposals were accepted and some rejected."""
    stats = engine.speculator.stats
    accepted, proposed = stats.num_accepted - before.num_accepted, stats.num_proposed - before.num_proposed
    assert accepted > 0, "no proposal was accepted: the test did not exercise speculation"
    assert accepted < proposed, "no proposal was rejected: rollbacks were not exercised"


def test_alone_equals_plain(spec_engine, plain):
    prompts, expected = plain
    engine = spec_engine
    before = dataclasses.replace(engine.speculator.stats)
    for prompt, want in zip(prompts, expected):
        assert engine.generate([prompt], GREEDY)[0][0].token_ids == want
    _check_speculated(engine, before)
    _check_all_blocks_free(engine)


def test_batched_with_sampled_rows_equals_plain(spec_engine, plain):
    """Greedy rows speculate next to sampled and grammar-free rows that draw normally; blocks held never
    exceed what the kept tokens need."""
    prompts, expected = plain
    engine = spec_engine
    before = dataclasses.replace(engine.speculator.stats)
    sampled = SamplingParams(max_tokens=32, temperature=0.8, seed=3, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"g{i}", p, GREEDY)
        engine.add_request(f"s{i}", p, sampled)
    got: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            for delta in out.deltas:
                got.setdefault(out.request_id, []).extend(delta.token_ids)
        for seq in engine.scheduler.running:  # rejected proposals' tail blocks went back after the step
            assert len(seq.block_table) <= engine.block_manager.blocks_for(seq.num_tokens)
    assert [got[f"g{i}"] for i in range(len(prompts))] == expected
    assert all(len(got[f"s{i}"]) == 32 for i in range(len(prompts)))
    _check_speculated(engine, before)
    _check_all_blocks_free(engine)


def test_prefix_cache_hits_and_preemption_equal_plain(default_model_dir, plain):
    prompts, expected = plain
    # 32 blocks x 4 tokens: six sequences of 40-90 tokens cannot all stay resident, and each repeat of a
    # prompt finds its earlier blocks cached.
    engine = make_engine(default_model_dir, speculative=True, block_size=4, max_model_len=128,
                         kv_cache_space=_gib_for_blocks(default_model_dir, 32, 4))
    assert engine.block_manager.num_blocks == 32
    before = dataclasses.replace(engine.speculator.stats)
    outputs = engine.generate(prompts + prompts, GREEDY)
    assert engine.scheduler.num_preemptions > 0
    assert engine.block_manager.prefix_hits > 0
    assert [o[0].token_ids for o in outputs] == expected + expected
    _check_speculated(engine, before)
    _check_all_blocks_free(engine)


def test_logprobs_stop_strings_and_n_equal_plain(plain_engine, spec_engine, plain):
    prompts, _ = plain
    params = [SamplingParams(max_tokens=30, temperature=0, logprobs=2, n=2),
              SamplingParams(max_tokens=40, temperature=0, stop=["polished"]),
              SamplingParams(max_tokens=40, temperature=0, stop=["return a *"]),
              SamplingParams(max_tokens=5, temperature=0, min_tokens=3)]
    chosen = [prompts[0], prompts[0], prompts[1], prompts[2]]
    reference = plain_engine.generate(chosen, params)
    engine = spec_engine
    before = dataclasses.replace(engine.speculator.stats)
    got = engine.generate(chosen, params)
    for want_seqs, got_seqs in zip(reference, got):
        for want, have in zip(want_seqs, got_seqs):
            assert have.token_ids == want.token_ids
            assert have.text == want.text
            assert have.finish_reason == want.finish_reason
            assert len(have.logprobs) == len(want.logprobs)
            for a, b in zip(have.logprobs, want.logprobs):
                assert a.token_id == b.token_id and a.top_ids == b.top_ids
                assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
    assert got[1][0].finish_reason == "stop" and "polished" not in got[1][0].text
    _check_speculated(engine, before)
    _check_all_blocks_free(engine)


def test_int8_kv_cache_equals_plain_int8(default_model_dir):
    """With the int8 KV cache too: verifying proposals writes and reads quantized rows exactly as plain
    decoding does, and rollbacks leave nothing behind."""
    plain_int8 = make_engine(default_model_dir, speculative=False, kv_cache_dtype="int8")
    spec_int8 = make_engine(default_model_dir, speculative=True, kv_cache_dtype="int8")
    assert spec_int8.runner.kv_caches[0].key.dtype == plain_int8.runner.kv_caches[0].key.dtype == torch.int8
    prompts = [plain_int8.tokenizer.encode(t) for t in TEXTS]
    expected = [plain_int8.generate([p], GREEDY)[0][0].token_ids for p in prompts]
    before = dataclasses.replace(spec_int8.speculator.stats)
    assert [spec_int8.generate([p], GREEDY)[0][0].token_ids for p in prompts] == expected
    assert [o[0].token_ids for o in spec_int8.generate(prompts, GREEDY)] == expected
    _check_speculated(spec_int8, before)
    _check_all_blocks_free(spec_int8)
