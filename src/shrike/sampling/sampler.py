"""Turns a batch of next-token logits into tokens, one row per sequence.

Every stage works on the whole batch at once: penalties, bans, grammar masks, temperature, top-k,
min-p, top-p and the draw itself; only rows with their own seed draw one by one (each from its own
generator). Penalties read per-sequence token-count tensors that grow by the new tokens each step.

Logprobs are taken from the model's raw distribution (before penalties, temperature, masks and
truncation) with one log_softmax over the same logits: asking for them costs a top-k.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from shrike.sampling.constraint import SequenceConstraint
from shrike.sampling.params import SamplingParams

@dataclass
class SamplingRow:
    """What the sampler needs to know about one sequence, and what it keeps between steps."""

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    eos_ids: frozenset[int]
    generator: torch.Generator | None  # seeded requests own one; others share the default
    constraint: SequenceConstraint | None = field(default=None, compare=False)  # from params.grammar unless given
    penalty_counts: "_PenaltyCounts | None" = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.constraint is None and self.params.grammar is not None:
            self.constraint = SequenceConstraint(self.params.grammar, self.eos_ids)


class _PenaltyCounts:
    """A sequence's token counts, kept up to date by adding only the tokens generated since the last step."""

    def __init__(self, vocab_size: int, prompt_ids: list[int], with_prompt: bool):
        self.output = torch.zeros(vocab_size, dtype=torch.int32)  # (V,) times each token was generated
        self.seen: torch.Tensor | None = None  # (V,) bool: in the prompt or generated (repetition penalty)
        if with_prompt:
            self.seen = torch.zeros(vocab_size, dtype=torch.bool)
            self.seen[torch.tensor(prompt_ids, dtype=torch.int64)] = True
        self.num_counted = 0

    def update(self, output_ids: list[int]) -> None:
        new = output_ids[self.num_counted:]
        if new:
            ids = torch.tensor(new, dtype=torch.int64)
            self.output.index_add_(0, ids, torch.ones(len(new), dtype=torch.int32))
            if self.seen is not None:
                self.seen[ids] = True
            self.num_counted = len(output_ids)


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


def _counts(row: SamplingRow, vocab_size: int) -> _PenaltyCounts:
    if row.penalty_counts is None:
        row.penalty_counts = _PenaltyCounts(vocab_size, row.prompt_ids, row.params.repetition_penalty != 1.0)
    row.penalty_counts.update(row.output_ids)
    return row.penalty_counts


def _apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    """logits: (B, V), changed in place."""
    vocab = logits.shape[1]
    repetition = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
    additive = [i for i, r in enumerate(rows) if (r.params.presence_penalty or r.params.frequency_penalty)
                and r.output_ids]
    counts = {i: _counts(rows[i], vocab) for i in dict.fromkeys(repetition + additive)}
    if repetition:
        idx = torch.tensor(repetition)
        seen = torch.stack([counts[i].seen for i in repetition])  # (R, V)
        penalty = torch.tensor([rows[i].params.repetition_penalty for i in repetition])[:, None]  # (R, 1)
        values = logits[idx]
        penalised = torch.where(values > 0, values / penalty, values * penalty)
        logits[idx] = torch.where(seen, penalised, values)
    if additive:
        idx = torch.tensor(additive)
        output = torch.stack([counts[i].output for i in additive]).to(logits.dtype)  # (A, V)
        presence = torch.tensor([rows[i].params.presence_penalty for i in additive])[:, None]  # (A, 1)
        frequency = torch.tensor([rows[i].params.frequency_penalty for i in additive])[:, None]  # (A, 1)
        logits[idx] -= presence * (output > 0) + frequency * output


def _apply_token_rules(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    """logit_bias, allowed_token_ids and bad_words (vLLM's): each row's own, in place."""
    vocab = logits.shape[1]
    for i, row in enumerate(rows):
        p = row.params
        if p.logit_bias:
            ids = [t for t in p.logit_bias if 0 <= t < vocab]
            logits[i, ids] += torch.tensor([p.logit_bias[t] for t in ids], dtype=logits.dtype)
        if p.allowed_token_ids is not None:
            keep = torch.full((vocab,), float("-inf"), dtype=logits.dtype)
            keep[[t for t in p.allowed_token_ids if 0 <= t < vocab]] = 0
            logits[i] += keep
        # A bad word's last token is banned where the output already ends with the tokens before it.
        banned = [word[-1] for word in p.bad_words_token_ids
                  if len(word) == 1 or row.output_ids[len(row.output_ids) - len(word) + 1:] == word[:-1]]
        if banned:
            logits[i, [t for t in banned if t < vocab]] = float("-inf")


def _ban_end_tokens(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    """Keep stop and EOS tokens out until a row has min_tokens."""
    for i, row in enumerate(rows):
        p = row.params
        if len(row.output_ids) < p.min_tokens:
            banned = [t for t in (set(p.stop_token_ids) | (set() if p.ignore_eos else row.eos_ids))
                      if t < logits.shape[1]]
            logits[i, banned] = float("-inf")


# Masks are expanded and applied with numpy, on this thread alone: a torch op here would wake torch's worker
# threads right after the grammar engine's native code ran, which on a busy machine can cost milliseconds.
def _allowed(masks: torch.Tensor, vocab_size: int) -> np.ndarray:
    # Little-endian int32 words: byte b of word w holds tokens 32w + 8b ... 32w + 8b + 7, lowest bit first.
    bits = np.unpackbits(masks.numpy().view(np.uint8), axis=1, bitorder="little")  # (R, 32 W) of 0/1
    if bits.shape[1] < vocab_size:  # ids the grammar's vocabulary does not cover
        bits = np.pad(bits, ((0, 0), (0, vocab_size - bits.shape[1])))
    return bits[:, :vocab_size].view(np.bool_)


def _apply_grammars(logits: torch.Tensor, rows: list[SamplingRow]) -> list[int]:
    """Mask each constrained row to what its grammar allows -> the constrained row indices."""
    masked = [(i, row.constraint.next_mask()) for i, row in enumerate(rows) if row.constraint is not None]
    masked = [(i, mask) for i, mask in masked if mask is not None]
    if not masked:
        return []
    idx = [i for i, _ in masked]
    allowed = _allowed(torch.stack([mask for _, mask in masked]), logits.shape[1])  # (C, V)
    values = logits[idx].numpy()  # (C, V), a copy
    constrained = np.where(allowed, values, -np.inf).astype(values.dtype)
    # A grammar that can only end while min_tokens bans the end tokens: the grammar wins.
    nothing_left = np.isneginf(constrained.max(axis=1))
    if nothing_left.any():
        lowest = np.finfo(values.dtype).min
        constrained[nothing_left] = np.where(allowed[nothing_left], np.maximum(values[nothing_left], lowest),
                                             -np.inf)
    logits[idx] = torch.from_numpy(constrained)
    return idx


def _truncate(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """logits: (R, V) already divided by temperature -> the same with excluded tokens at -inf."""
    vocab = logits.shape[1]
    top_k = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    if any(top_k):
        k = torch.tensor(top_k)  # (R,)
        values = logits.topk(max(top_k), dim=-1).values  # (R, max k)
        kth = values.gather(1, (k - 1).clamp(min=0)[:, None])  # (R, 1)
        kth[k == 0] = float("-inf")
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if any(p.min_p > 0 for p in params):
        min_p = torch.tensor([p.min_p for p in params])[:, None]  # (R, 1)
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, float("-inf"))
    if any(p.top_p < 1.0 for p in params):
        top_p = torch.tensor([p.top_p for p in params])[:, None]  # (R, 1)
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= top_p
        drop_sorted[top_p[:, 0] >= 1.0] = False
        drop_sorted[:, 0] = False  # a top_p below float32's smallest number rounds to 0 and would drop every token
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probabilities(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """logits: (R, V) of non-greedy rows, penalties and masks applied -> (R, V) the distribution drawn from
    (temperature, then top-k, min-p and top-p)."""
    temperature = torch.tensor([r.params.temperature for r in rows], dtype=logits.dtype)[:, None]  # (R, 1)
    # A tiny repetition penalty or temperature can push logits to +inf, and softmax makes every probability NaN.
    scaled = (logits / temperature).clamp(max=torch.finfo(logits.dtype).max)
    return _truncate(scaled, [r.params for r in rows]).softmax(-1)


def _draw(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """logits: (R, V) of non-greedy rows -> (R,) token ids."""
    probs = probabilities(logits, rows)
    seeded = [i for i, r in enumerate(rows) if r.generator is not None]
    if len(seeded) == len(rows):
        tokens = torch.empty(len(rows), dtype=torch.int64)
    else:
        tokens = torch.multinomial(probs, 1)[:, 0]
    for i in seeded:  # the per-row path: each seed draws from its own stream
        tokens[i] = torch.multinomial(probs[i], 1, generator=rows[i].generator)[0]
    return tokens


def processed_logits(logits: torch.Tensor, rows: list[SamplingRow]) -> tuple[torch.Tensor, list[int]]:
    """logits: (B, V) raw -> a copy with penalties, end-token bans and grammar masks applied, and the
    constrained row indices."""
    logits = logits.clone()
    _apply_penalties(logits, rows)
    _apply_token_rules(logits, rows)
    _ban_end_tokens(logits, rows)
    return logits, _apply_grammars(logits, rows)


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> tuple[torch.Tensor, list[TokenLogprobs | None]]:
    """logits: (B, V) fp32, one row per entry of `rows` -> token ids (B,), logprobs per row.

    Constrained rows' grammars advance by the chosen tokens, and start on their next masks.
    """
    want_logprobs = [r.params.logprobs is not None for r in rows]
    raw_logprobs = torch.log_softmax(logits, dim=-1) if any(want_logprobs) else None
    logits, constrained = processed_logits(logits, rows)
    tokens = logits.argmax(dim=-1)  # (B,) right for the greedy rows
    sampled = [i for i, r in enumerate(rows) if not r.params.greedy]
    if sampled:
        tokens[torch.tensor(sampled)] = _draw(logits[sampled], [rows[i] for i in sampled])
    for i in constrained:
        rows[i].constraint.accept(int(tokens[i]))
    results: list[TokenLogprobs | None] = [None] * len(rows)
    if raw_logprobs is not None:
        idx = [i for i, w in enumerate(want_logprobs) if w]
        k = max(rows[i].params.logprobs for i in idx)
        for i, lp in zip(idx, top_logprobs(raw_logprobs[idx], tokens[idx], k)):
            n = rows[i].params.logprobs
            lp.top_ids, lp.top_logprobs = lp.top_ids[:n], lp.top_logprobs[:n]
            results[i] = lp
    return tokens, results
