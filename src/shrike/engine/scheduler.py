"""Decides which sequences run in the next step and how many of their tokens.

Each step has a token budget shared by decodes (one token each) and prompt chunks, so a
long prompt is prefilled in pieces while running sequences keep decoding. Running
sequences go first, oldest first; when KV blocks run out the newest running sequence is
preempted: its blocks are freed and it is recomputed later.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from shrike.engine.block_manager import BlockManager
from shrike.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_tokens: int  # tokens computed for it this step


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledSequence]:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledSequence] = []
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status != SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_tokens = min(seq.num_uncomputed_tokens, budget)
            while not self.block_manager.can_grow(seq, num_tokens):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:
                continue
            self.block_manager.grow(seq, num_tokens)
            scheduled.append(ScheduledSequence(seq, num_tokens))
            budget -= num_tokens
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            self.block_manager.reuse_cached_prefix(seq)
            num_tokens = min(seq.num_uncomputed_tokens, budget)
            if not self.block_manager.can_grow(seq, num_tokens):
                # A waiting sequence must hold no blocks, or two of them can starve each other.
                self.block_manager.release(seq)
                break
            self.waiting.popleft()
            self.block_manager.grow(seq, num_tokens)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(ScheduledSequence(seq, num_tokens))
            budget -= num_tokens
        return scheduled

    def after_step(self, batch: list[ScheduledSequence]) -> None:
        for item in batch:
            self.block_manager.register_full_blocks(item.seq)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.release(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark finished (stop, length or abort) and return its blocks to the pool."""
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.block_manager.release(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
