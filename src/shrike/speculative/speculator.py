"""Decides per sequence whether and what to propose each step, and keeps the acceptance figures.

Adaptive: a sequence whose recent proposals are mostly rejected stops proposing for a while (longer
each time it fails again), since each rejected proposal costs a wider forward step (and, with a draft
model, the draft's own steps).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shrike.engine.sequence import Sequence
from shrike.speculative.config import SpeculativeConfig
from shrike.speculative.ngram import propose_ngram

# Below this recent share of accepted proposals a sequence pauses proposing.
MIN_ACCEPTANCE = 0.25
EMA_WEIGHT = 0.3  # weight of the latest step in the recent acceptance rate
FIRST_PAUSE, MAX_PAUSE = 8, 256  # decode steps


@dataclass
class SpecStats:
    """Running totals since start (the server copies them into its counters)."""

    num_drafts: int = 0  # steps in which a sequence verified proposals
    num_proposed: int = 0  # proposed tokens
    num_accepted: int = 0  # of those, accepted
    num_emitted: int = 0  # tokens the verifying steps produced (accepted + the target's own)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_proposed if self.num_proposed else 0.0


class _SequenceState:
    def __init__(self):
        self.ids = np.empty(256, dtype=np.int64)  # (capacity,) the sequence's tokens, grown as it grows
        self.count = 0
        self.recent_acceptance = 1.0
        self.paused_steps = 0  # decode steps left without proposing
        self.next_pause = FIRST_PAUSE

    def tokens(self, token_ids: list[int]) -> np.ndarray:
        """token_ids as an array, copying only what was appended since the last call."""
        n = len(token_ids)
        if n < self.count:  # tokens were dropped: copy afresh
            self.count = 0
        if n > self.ids.shape[0]:
            grown = np.empty(max(n, 2 * self.ids.shape[0]), dtype=np.int64)
            grown[:self.count] = self.ids[:self.count]
            self.ids = grown
        self.ids[self.count:n] = token_ids[self.count:n]
        self.count = n
        return self.ids[:n]


class Speculator:
    def __init__(self, config: SpeculativeConfig, draft_model=None):
        """draft_model: a shrike.speculative.draft_model.DraftModel for method draft_model."""
        self.config = config
        self.draft_model = draft_model
        self.stats = SpecStats()

    @staticmethod
    def _state(seq: Sequence) -> _SequenceState:
        if seq.spec_state is None:
            seq.spec_state = _SequenceState()
        return seq.spec_state

    def wanted(self, seq: Sequence) -> int:
        """How many tokens to propose for a decoding sequence this step (0 while it pauses)."""
        if seq.params.grammar is not None:  # a grammar advances token by token; not speculated on
            return 0
        state = self._state(seq)
        if state.paused_steps > 0:
            state.paused_steps -= 1
            return 0
        return self.config.num_speculative_tokens

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[list[int]]:
        """(sequence, at most this many tokens) -> each one's proposed next tokens (maybe none)."""
        if self.draft_model is not None:
            return self.draft_model.propose(requests)
        c = self.config
        return [propose_ngram(self._state(seq).tokens(seq.token_ids), limit, c.prompt_lookup_min, c.prompt_lookup_max)
                for seq, limit in requests]

    def forget(self, seq: Sequence) -> None:
        """The sequence finished or was preempted: a draft model frees its copy."""
        if self.draft_model is not None:
            self.draft_model.release(seq)

    def record(self, seq: Sequence, num_proposed: int, num_accepted: int) -> None:
        """After a verifying step of the sequence."""
        s = self.stats
        s.num_drafts += 1
        s.num_proposed += num_proposed
        s.num_accepted += num_accepted
        s.num_emitted += num_accepted + 1
        state = self._state(seq)
        rate = num_accepted / num_proposed
        state.recent_acceptance = (1 - EMA_WEIGHT) * state.recent_acceptance + EMA_WEIGHT * rate
        if state.recent_acceptance < MIN_ACCEPTANCE:
            state.paused_steps = state.next_pause
            state.next_pause = min(2 * state.next_pause, MAX_PAUSE)
            state.recent_acceptance = 2 * MIN_ACCEPTANCE  # a fresh chance after the pause
        elif rate >= 0.5:
            state.next_pause = FIRST_PAUSE
