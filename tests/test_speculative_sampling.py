"""Rejection sampling keeps sampled outputs distributed exactly as the target model's (chi-square tests)."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from shrike.engine.llm_engine import EngineConfig, LLMEngine
from shrike.sampling.params import SamplingParams
from shrike.sampling.sampler import SamplingRow
from shrike.sampling.verify import verify

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
P_VALUE_FLOOR = 1e-3


def chi_square_p_value(observed: list[list[int]]) -> float:
    """Homogeneity test of a (samples, categories) table of counts -> p-value."""
    table = torch.tensor(observed, dtype=torch.float64)
    table = table[:, table.sum(0) > 0]
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    stat = ((table - expected) ** 2 / expected).sum()
    df = (table.shape[0] - 1) * (table.shape[1] - 1)
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def goodness_of_fit_p_value(counts: list[int], probs: list[float]) -> float:
    observed = torch.tensor(counts, dtype=torch.float64)
    expected = torch.tensor(probs, dtype=torch.float64) * observed.sum()
    stat = ((observed - expected) ** 2 / expected).sum()
    return float(torch.special.gammaincc(torch.tensor((len(counts) - 1) / 2, dtype=torch.float64), stat / 2))


def _binned(samples: list[list[int]], min_count: int = 5) -> list[list[int]]:
    """Per sample set, counts over the categories seen often enough; the rare rest share one bin."""
    total = Counter(t for s in samples for t in s)
    common = sorted(t for t, c in total.items() if c >= min_count)
    rows = []
    for s in samples:
        c = Counter(s)
        rows.append([c[t] for t in common] + [sum(v for t, v in c.items() if t not in common)])
    return rows


@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_verify_follows_the_target_distribution(with_draft_probs):
    """Known target p and proposal q over 5 tokens: the first emitted token must follow p."""
    target = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05])
    proposal = torch.tensor([0.1, 0.6, 0.1, 0.1, 0.1])
    logits = target.log().repeat(2, 1)  # (k + 1 = 2, V): rows for the draft position and the bonus
    row = SamplingRow(SamplingParams(temperature=1.0), [0], [], frozenset(), torch.Generator().manual_seed(7))
    draws = torch.multinomial(proposal, 2000, replacement=True, generator=torch.Generator().manual_seed(1))
    counts = [0] * 5
    for x in draws.tolist():
        if with_draft_probs:  # a sampling proposer: q is its distribution
            result = verify(logits, [row], [[x]], [proposal[None, :]])
        else:  # a deterministic proposer: q is one-hot at x
            result = verify(logits, [row], [[x]], [None])
        counts[result[0].tokens[0]] += 1
    assert goodness_of_fit_p_value(counts, target.tolist()) > P_VALUE_FLOOR


def _tokens_at(engine: LLMEngine, prompt: list[int], params: SamplingParams, positions: list[int]):
    out = engine.generate([prompt], params)[0]
    return [[seq.token_ids[p] for seq in out] for p in positions]


def test_sampled_engine_output_matches_plain_distribution(default_model_dir):
    """Many seeds at temperature 1 on a text whose continuation n-gram lookup guesses often (and, sampled,
    often wrongly): token frequencies at several output positions agree with plain decoding."""
    def engine(speculative: bool) -> LLMEngine:
        return LLMEngine(EngineConfig(model=str(default_model_dir), dtype="float32", max_model_len=128,
                                      progress=False, max_num_seqs=256, kv_cache_space=0.25,
                                      speculative_config=NGRAM if speculative else None))
    plain, spec = engine(False), engine(True)
    prompt = plain.tokenizer.encode("1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,")
    positions = [1, 2, 3]
    n = 200
    want = _tokens_at(plain, prompt, SamplingParams(n=n, max_tokens=4, temperature=1.0, seed=1000, ignore_eos=True),
                      positions)
    got = _tokens_at(spec, prompt, SamplingParams(n=n, max_tokens=4, temperature=1.0, seed=5000, ignore_eos=True),
                     positions)
    stats = spec.speculator.stats
    assert stats.num_accepted > 40 and stats.num_proposed - stats.num_accepted > 40, stats
    for position, a, b in zip(positions, want, got):
        p = chi_square_p_value(_binned([a, b]))
        assert p > P_VALUE_FLOOR, f"output position {position}: p = {p:.2e}"
