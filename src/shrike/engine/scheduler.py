"""Decides which sequences run in the next step and how many of their tokens.

Each step has a token budget shared by decodes (one token each) and prompt chunks, so a
long prompt is prefilled in pieces while running sequences keep decoding. Running
sequences go first, oldest first; when KV blocks run out the newest running sequence is
preempted: its blocks are freed and it is recomputed later.

With a speculator, a decoding sequence may run its proposed next tokens too (from the same budget
and blocks); what verification rejects is rolled back after the step.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shrike.engine.block_manager import BlockManager
from shrike.engine.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from shrike.speculative.speculator import Speculator


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_tokens: int  # tokens computed for it this step (its uncomputed ones, then the draft)
    draft: list[int] = field(default_factory=list)  # proposed tokens to verify after the sequence's last one


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int | None = None, eos_ids: frozenset[int] = frozenset(),
                 speculator: Speculator | None = None):
        self.speculator = speculator
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.eos_ids = eos_ids
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.lora = None  # the engine's shrike.engine.lora.LoRAManager when LoRA is on: running sequences hold slots

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledSequence]:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledSequence] = []
        drafts = self._propose()
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status != SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_tokens = min(seq.num_uncomputed_tokens, budget)
            draft = drafts.get(seq.seq_id, [])[:budget - num_tokens]
            if draft and not self.block_manager.can_grow(seq, num_tokens + len(draft)):
                draft = []  # no blocks to spare: decode plainly rather than preempt anyone for a guess
            num_tokens += len(draft)
            while not self.block_manager.can_grow(seq, num_tokens):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:
                continue
            self.block_manager.grow(seq, num_tokens)
            scheduled.append(ScheduledSequence(seq, num_tokens, draft))
            budget -= num_tokens
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            self.block_manager.reuse_cached_prefix(seq)
            num_tokens = min(seq.num_uncomputed_tokens, budget)
            if not self.block_manager.can_grow(seq, num_tokens):
                # A waiting sequence must hold no blocks, or two of them can starve each other.
                self.block_manager.release(seq)
                break
            if seq.lora is not None and not self.lora.acquire(seq.lora):
                self.block_manager.release(seq)  # every adapter slot is in use: wait for one
                break
            self.waiting.popleft()
            self.block_manager.grow(seq, num_tokens)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(ScheduledSequence(seq, num_tokens))
            budget -= num_tokens
        return scheduled

    def _propose(self) -> dict[int, list[int]]:
        """Proposals for the decoding sequences, asked of the speculator at once -> seq_id: draft.

        Each gets no more than the speculator wants, the step budget left after every running sequence's
        own tokens, max_tokens and the context leave room for (a verifying step emits up to one token
        more than it proposes)."""
        if self.speculator is None:
            return {}
        spare = self.max_num_batched_tokens - sum(seq.num_uncomputed_tokens for seq in self.running)
        requests = []
        for seq in self.running:
            if spare <= 0:
                break
            if seq.num_uncomputed_tokens != 1:
                continue
            room = min(spare, self.speculator.wanted(seq))
            if seq.params.max_tokens is not None:
                room = min(room, seq.params.max_tokens - len(seq.output_ids) - 1)
            if self.max_model_len is not None:
                room = min(room, self.max_model_len - seq.num_tokens - 1)
            if room > 0:
                requests.append((seq, room))
                spare -= room
        drafts = self.speculator.propose(requests) if requests else []
        return {seq.seq_id: draft for (seq, _), draft in zip(requests, drafts) if draft}

    def postprocess(self, batch: list[ScheduledSequence], outputs: list) -> list[tuple[Sequence, str | None, int]]:
        """Applies what the model runner computed (one shrike.engine.model_runner.SequenceOutput per
        scheduled sequence): computed counts, prompt logprobs, new tokens, the rollback of rejected
        proposals, and the stop-token and length checks. Returns (sequence, finish reason or None,
        number of new tokens) for each sequence that got tokens; finished ones are already released."""
        produced = []
        for item, out in zip(batch, outputs):
            seq = item.seq
            seq.prompt_logprobs += out.prompt_logprobs
            reason = None
            num_new = 0
            for i, token in enumerate(out.tokens):
                seq.append_token(token)
                if out.logprobs is not None:
                    seq.output_logprobs.append(out.logprobs[i])
                num_new += 1
                reason = self._finish_reason(seq, token)
                if reason is not None:
                    break  # later verified tokens are not part of the output
            # K/V of accepted proposals after an ending token stays uncounted; it is released just below.
            seq.num_computed_tokens = min(seq.num_computed_tokens + out.num_computed, max(seq.num_tokens - 1, 0)) \
                if num_new else seq.num_computed_tokens + out.num_computed
            if item.draft:
                self.speculator.record(seq, len(item.draft), len(out.tokens) - 1)
                self.block_manager.trim(seq, seq.num_tokens)
            self.block_manager.register_full_blocks(seq)
            if out.pooled is not None:  # an embedding: done once its whole prompt is pooled
                seq.pooling.add(out.pooled)
                if seq.num_computed_tokens == seq.num_tokens:
                    reason = "stop"
            if reason is not None:
                self.finish(seq, reason)
            if num_new or (out.pooled is not None and reason is not None):
                produced.append((seq, reason, num_new))
        return produced

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        # The sampler keeps these tokens out until min_tokens are generated.
        if token in p.stop_token_ids or (token in self.eos_ids and not p.ignore_eos):
            return "stop"
        if p.max_tokens is not None and len(seq.output_ids) >= p.max_tokens:
            return "length"
        if self.max_model_len is not None and seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        if seq.lora is not None:
            self.lora.release(seq.lora)
        self.block_manager.release(seq)
        if self.speculator is not None:
            self.speculator.forget(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark finished (stop, length or abort) and return its blocks to the pool. For a sequence
        finished already (a stop string found in the text of its last token) only the reason changes."""
        if seq.status == SequenceStatus.FINISHED:
            seq.finish_reason = reason
            return
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
            if seq.lora is not None:
                self.lora.release(seq.lora)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.block_manager.release(seq)
        if self.speculator is not None:
            self.speculator.forget(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
