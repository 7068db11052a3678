"""A draft model (here the default model drafting for itself) proposes tokens from its own KV cache;
greedy output equals plain decoding, and both block pools are whole again afterwards."""
from __future__ import annotations

from shrike.engine.llm_engine import EngineConfig, LLMEngine
from shrike.sampling.params import SamplingParams

TEXTS = ["The quick brown fox", "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n", "Water boils at"]
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def test_draft_model_greedy_equals_plain(default_model_dir):
    def engine(spec) -> LLMEngine:
        return LLMEngine(EngineConfig(model=str(default_model_dir), dtype="float32", max_model_len=256,
                                      progress=False, speculative_config=spec))
    plain = engine(None)
    prompts = [plain.tokenizer.encode(t) for t in TEXTS]
    want = [o[0].token_ids for o in plain.generate(prompts, GREEDY)]
    spec = engine({"model": str(default_model_dir), "num_speculative_tokens": 3})
    sampled = SamplingParams(max_tokens=24, temperature=0.8, seed=1, ignore_eos=True)
    got = spec.generate(prompts + prompts[:1], [GREEDY] * len(prompts) + [sampled])
    assert [o[0].token_ids for o in got[:len(prompts)]] == want
    assert len(got[-1][0].token_ids) == 24
    stats = spec.speculator.stats
    # The same weights draft for themselves: the greedy rows accept nearly everything; the sampled row's
    # greedy drafts are often rejected (77% overall when this was written).
    assert stats.num_accepted > 0.6 * stats.num_proposed > 0
    draft = spec.speculator.draft_model
    assert not spec.scheduler.running and spec.block_manager.num_free_blocks == spec.block_manager.num_blocks
    assert not draft.shadows and draft.block_manager.num_free_blocks == draft.block_manager.num_blocks
