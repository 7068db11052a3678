"""A sequence's grammar during generation, with its next token mask computed ahead on a worker thread.

After the sampler accepts a token, the mask for the following step is computed on the worker while the
engine appends the token, schedules and runs the model; the sampler only waits if it is not ready yet.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from shrike.sampling.grammar import CompiledGrammar, mask_words

logger = logging.getLogger(__name__)

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _worker() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            # One thread: a mask takes well under a millisecond and the compute threads already own the cores.
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shrike-grammar")
        return _pool


class SequenceConstraint:
    def __init__(self, grammar: CompiledGrammar, eos_ids: frozenset[int]):
        self.matcher = grammar.matcher()
        self.eos_ids = [t for t in eos_ids if t < grammar.vocab_size]
        self.mask = torch.empty(mask_words(grammar.vocab_size), dtype=torch.int32)  # (ceil(V/32),) bit t: t allowed
        self.broken = False  # the grammar refused a token: the rest is unconstrained
        self._pending: Future | None = None
        self._schedule()

    def _schedule(self) -> None:
        self._pending = _worker().submit(self.matcher.fill_mask, self.mask)

    def next_mask(self) -> torch.Tensor | None:
        """(ceil(V/32),) int32 bitmask of the tokens allowed next; None when unconstrained."""
        if self.broken:
            return None
        if self._pending is not None:
            if self._pending.cancel():  # the worker has not got to it: faster to compute it here
                self.matcher.fill_mask(self.mask)
            else:
                self._pending.result()
            self._pending = None
        return self.mask

    def accept(self, token_id: int) -> None:
        if self.broken:
            return
        self._pending = None
        if self.matcher.is_terminated():
            return  # an end token after a complete grammar; the mask stays end-tokens-only
        if not self.matcher.accept(token_id):
            # Only when the grammar's choices were all banned (e.g. min_tokens against a finished grammar).
            logger.warning("the grammar refused token %d; the rest of this sequence is unconstrained", token_id)
            self.broken = True
        elif self.matcher.is_terminated():
            self._only_end_tokens()
        else:
            self._schedule()

    def _only_end_tokens(self) -> None:
        self.mask.zero_()
        for token_id in self.eos_ids:
            self.mask[token_id // 32] |= _bit(token_id % 32)


def _bit(index: int) -> int:
    # int32 words: bit 31 is the sign bit.
    return -(1 << 31) if index == 31 else 1 << index
