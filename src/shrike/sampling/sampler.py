"""Turns a batch of next-token logits into tokens, one row per sequence.

Logprobs are taken from the model's raw distribution (before penalties, temperature and
truncation) with one log_softmax over the same logits: asking for them costs a top-k.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from shrike.sampling.params import SamplingParams


@dataclass
class SamplingRow:
    """What the sampler needs to know about one sequence."""

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    eos_ids: frozenset[int]
    generator: torch.Generator | None  # seeded requests own one; others share the default


@dataclass
class TokenLogprobs:
    token_id: int
    logprob: float
    top_ids: list[int]  # (k,)
    top_logprobs: list[float]  # (k,)


def top_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, k: int) -> list[TokenLogprobs]:
    """logprobs: (R, V) log-probabilities; token_ids: (R,) the tokens that were chosen."""
    chosen = logprobs.gather(1, token_ids[:, None])[:, 0].tolist()
    if k > 0:
        values, indices = logprobs.topk(k, dim=-1)
        values, indices = values.tolist(), indices.tolist()
    else:
        values = indices = [[] for _ in chosen]
    return [TokenLogprobs(int(t), c, i, v) for t, c, i, v in zip(token_ids.tolist(), chosen, indices, values)]


def _apply_penalties(logits: torch.Tensor, row: SamplingRow) -> None:
    p = row.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(row.prompt_ids) | set(row.output_ids)), dtype=torch.int64)
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and row.output_ids:
        ids, counts = torch.tensor(row.output_ids, dtype=torch.int64).unique(return_counts=True)
        logits[ids] -= p.presence_penalty + p.frequency_penalty * counts.to(logits.dtype)


def _truncate(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """logits: (V,) already divided by temperature -> the same with excluded tokens at -inf."""
    if p.top_k > 0 and p.top_k < logits.shape[-1]:
        kth = logits.topk(p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.min_p > 0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = logits.sort(descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= p.top_p
        drop_sorted[0] = False  # a top_p below float32's smallest number rounds to 0 and would drop every token
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> tuple[torch.Tensor, list[TokenLogprobs | None]]:
    """logits: (B, V) fp32, one row per entry of `rows` -> token ids (B,), logprobs per row."""
    want_logprobs = [r.params.logprobs is not None for r in rows]
    raw_logprobs = torch.log_softmax(logits, dim=-1) if any(want_logprobs) else None
    logits = logits.clone()
    tokens = torch.empty(len(rows), dtype=torch.int64)
    for i, row in enumerate(rows):
        p = row.params
        row_logits = logits[i]
        _apply_penalties(row_logits, row)
        if len(row.output_ids) < p.min_tokens:
            banned = [t for t in (set(p.stop_token_ids) | (set() if p.ignore_eos else row.eos_ids)) if t < row_logits.shape[0]]
            row_logits[banned] = float("-inf")
        if p.greedy:
            tokens[i] = int(row_logits.argmax())
            continue
        # A tiny repetition penalty or temperature can push logits to +inf, and softmax makes every probability NaN.
        row_logits = _truncate((row_logits / p.temperature).clamp(max=torch.finfo(row_logits.dtype).max), p)
        probs = row_logits.softmax(-1)
        tokens[i] = int(torch.multinomial(probs, 1, generator=row.generator))
    results: list[TokenLogprobs | None] = [None] * len(rows)
    if raw_logprobs is not None:
        idx = [i for i, w in enumerate(want_logprobs) if w]
        k = max(rows[i].params.logprobs for i in idx)
        for i, lp in zip(idx, top_logprobs(raw_logprobs[idx], tokens[idx], k)):
            n = rows[i].params.logprobs
            lp.top_ids, lp.top_logprobs = lp.top_ids[:n], lp.top_logprobs[:n]
            results[i] = lp
    return tokens, results
