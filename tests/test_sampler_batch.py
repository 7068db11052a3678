"""The batched sampler against a plain one-row-at-a-time reference, over steps whose outputs grow."""
from __future__ import annotations

import random

import torch

from shrike.sampling.params import SamplingParams
from shrike.sampling.sampler import SamplingRow, sample

V = 500


def _reference(logits: torch.Tensor, row: SamplingRow) -> int:
    """One row, written as directly as possible: penalties from the whole context, then the draw."""
    p, logits = row.params, logits.clone()
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(row.prompt_ids) | set(row.output_ids)))
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
    if row.output_ids:
        ids, counts = torch.tensor(row.output_ids).unique(return_counts=True)
        logits[ids] -= p.presence_penalty + p.frequency_penalty * counts.to(logits.dtype)
    if len(row.output_ids) < p.min_tokens:
        logits[sorted(row.eos_ids)] = float("-inf")
    if p.greedy:
        return int(logits.argmax())
    logits = logits / p.temperature
    if p.top_k > 0:
        logits = logits.masked_fill(logits < logits.topk(p.top_k).values[-1], float("-inf"))
    if p.min_p > 0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = logits.sort(descending=True)
        probs = sorted_logits.softmax(-1)
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(0, order, (probs.cumsum(-1) - probs) >= p.top_p)
        logits = logits.masked_fill(drop, float("-inf"))
    return int(torch.multinomial(logits.softmax(-1), 1, generator=row.generator))


def _params(rng: random.Random) -> dict:
    return dict(temperature=rng.choice([0, 0.7, 1.3]), top_k=rng.choice([-1, 3, 40]), top_p=rng.choice([1.0, 0.8]),
                min_p=rng.choice([0.0, 0.1]), repetition_penalty=rng.choice([1.0, 1.4]),
                presence_penalty=rng.choice([0.0, 0.6]), frequency_penalty=rng.choice([0.0, 0.3]),
                min_tokens=rng.choice([0, 3]), seed=rng.randrange(1000))


def test_seeded_and_greedy_rows_match_the_reference_step_after_step():
    rng = random.Random(0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(10):
        settings = [_params(rng) for _ in range(rng.randint(1, 6))]
        prompts = [[rng.randrange(V) for _ in range(12)] for _ in settings]

        def rows():
            return [SamplingRow(SamplingParams(**s), prompt, [], frozenset({7}),
                                torch.Generator().manual_seed(s["seed"])) for s, prompt in zip(settings, prompts)]
        batched, reference = rows(), rows()
        for _ in range(8):
            logits = torch.randn(len(settings), V, generator=generator) * 3
            tokens, _ = sample(logits, batched)
            expected = [_reference(logits[i], row) for i, row in enumerate(reference)]
            assert tokens.tolist() == expected
            for row_a, row_b, token in zip(batched, reference, expected):
                row_a.output_ids.append(token)  # the penalty counts catch up with these incrementally
                row_b.output_ids.append(token)


def test_unseeded_rows_are_drawn_together_from_their_own_distributions():
    logits = torch.full((2, V), -10.0)
    logits[0, 5] = logits[0, 6] = 10.0
    logits[1, 9] = 10.0
    rows = [SamplingRow(SamplingParams(temperature=1.0, top_k=2), [0], [], frozenset(), None) for _ in range(2)]
    drawn = [tuple(sample(logits, rows)[0].tolist()) for _ in range(50)]
    assert {a for a, _ in drawn} == {5, 6} and {b for _, b in drawn} == {9}
