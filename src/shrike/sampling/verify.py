"""Checks proposed tokens against the target model's logits: exact for greedy and for sampled requests.

A sequence that speculated ran its last token and k proposals d_0..d_{k-1} as one chunk, so logits
row j is the target's next-token distribution given the proposals before it. Row j is scored as if
d_0..d_{j-1} were already generated (penalties and min_tokens see them), which is right exactly when
it is used: only while every earlier proposal was accepted.

Greedy: accept the longest prefix where the target's choice equals the proposal, then add the target's
own choice — token for token what decoding one at a time gives. Sampled: the standard rejection
sampling (accept d_j with probability min(1, p(d_j) / q(d_j)); on rejection draw from the normalised
max(0, p - q)), whose output follows p exactly; a deterministic proposer has q = one-hot(d_j).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from shrike.sampling.sampler import (
    SamplingRow,
    TokenLogprobs,
    probabilities,
    processed_logits,
    top_logprobs,
)


@dataclass
class Verified:
    tokens: list[int]  # the accepted proposals followed by the target's own token
    logprobs: list[TokenLogprobs] | None  # of each token, from the target's raw logits, when asked for

    @property
    def num_accepted(self) -> int:
        return len(self.tokens) - 1


def _row_given(row: SamplingRow, proposed: list[int]) -> SamplingRow:
    """The sampling state as if `proposed` had been generated (fresh penalty counts, no grammar)."""
    return SamplingRow(row.params, row.prompt_ids, row.output_ids + proposed, row.eos_ids, row.generator)


def verify(logits: torch.Tensor, rows: list[SamplingRow], drafts: list[list[int]],
           draft_probs: list[torch.Tensor | None]) -> list[Verified]:
    """logits: (sum(k_i + 1), V) fp32, sequence i's k_i + 1 rows in order; drafts[i]: its k_i proposals;
    draft_probs[i]: (k_i, V) the proposer's distributions, or None for a deterministic proposer."""
    virtual = [_row_given(row, draft[:j]) for row, draft in zip(rows, drafts) for j in range(len(draft) + 1)]
    processed, _ = processed_logits(logits, virtual)
    greedy_choice = processed.argmax(dim=-1).tolist()  # (R,)
    results = []
    offset = 0
    for row, draft, q in zip(rows, drafts, draft_probs):
        k = len(draft)
        if row.params.greedy:
            choice = greedy_choice[offset:offset + k + 1]
            m = next((j for j in range(k) if choice[j] != draft[j]), k)
            tokens = choice[:m + 1]
        else:
            p = probabilities(processed[offset:offset + k + 1], virtual[offset:offset + k + 1])  # (k+1, V)
            tokens = _rejection_sample(p, draft, q, row.generator)
        logprobs = None
        if row.params.logprobs is not None:
            raw = torch.log_softmax(logits[offset:offset + len(tokens)], dim=-1)
            logprobs = top_logprobs(raw, torch.tensor(tokens, dtype=torch.int64), row.params.logprobs)
        results.append(Verified(tokens, logprobs))
        offset += k + 1
    return results


def _rejection_sample(p: torch.Tensor, draft: list[int], q: torch.Tensor | None,
                      generator: torch.Generator | None) -> list[int]:
    """p: (k+1, V) target distributions; q: (k, V) proposal distributions or None (one-hot proposals)."""
    k = len(draft)
    uniforms = torch.rand(k, generator=generator, dtype=torch.float64).tolist() if k else []
    for j, x in enumerate(draft):
        px = float(p[j, x])
        qx = 1.0 if q is None else float(q[j, x])
        if uniforms[j] * qx < px:  # accept with probability min(1, px / qx)
            continue
        if q is None:
            residual = p[j].clone()
            residual[x] = 0.0
        else:
            residual = (p[j] - q[j]).clamp(min=0.0)
        if not float(residual.sum()) > 0.0:  # p == q up to rounding: the rejection had probability ~0
            residual = p[j]
        token = int(torch.multinomial(residual, 1, generator=generator)[0])
        return draft[:j] + [token]
    return draft + [int(torch.multinomial(p[k], 1, generator=generator)[0])]
