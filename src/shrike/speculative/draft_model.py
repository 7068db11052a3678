"""A draft model: a smaller (or more aggressively quantized) checkpoint with the target's tokenizer that
proposes the next tokens by decoding greedily ahead of the target.

It has its own KV cache, blocks and model runner. For each target sequence it keeps a shadow sequence
holding the same tokens; before proposing, the shadow drops what the target rejected (its computed
count and tail blocks roll back to the common prefix) and computes what the target added. Greedy
drafting makes the proposal a function of the context (q one-hot), so verification stays exact for
sampled requests too.
"""
from __future__ import annotations

import torch

from shrike.engine.block_manager import BlockManager
from shrike.engine.model_runner import ModelRunner
from shrike.engine.scheduler import ScheduledSequence
from shrike.engine.sequence import Sequence, SequenceStatus
from shrike.errors import ConfigError
from shrike.model.loader import load_model
from shrike.sampling.params import SamplingParams

_GREEDY = SamplingParams(max_tokens=None, temperature=0)


class DraftModel:
    def __init__(self, model: str, target_tokens: list[str], dtype: str, max_model_len: int, block_size: int,
                 max_num_seqs: int, max_num_batched_tokens: int, kv_dtype: torch.dtype, capacity_tokens: int,
                 kernel_backend: str, compiled_forward: bool, progress: bool):
        loaded = load_model(model, dtype, max_model_len, progress=progress, kernel_backend=kernel_backend)
        if loaded.tokenizer.token_strings() != target_tokens:
            raise ConfigError(f"speculative config: the draft model {model} has a different tokenizer than the "
                              "target; a draft must share the target's vocabulary")
        self.max_model_len = loaded.max_model_len
        # Room for as many tokens as the target's cache holds: the shadows hold the same tokens.
        plan = loaded.plan_kv_cache(capacity_tokens * loaded.kv_bytes_per_token(kv_dtype) / 2**30, block_size, max_num_seqs, kv_dtype)
        self.block_manager = BlockManager(plan.num_blocks, block_size, enable_prefix_caching=False)
        self.runner = ModelRunner(loaded.model, plan.num_blocks, block_size, kv_dtype, max_num_seqs,
                                  max_num_batched_tokens, loaded.max_model_len, compile=compiled_forward)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.shadows: dict[int, tuple[Sequence, Sequence]] = {}  # target seq_id -> (target, shadow)

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[list[int]]:
        drafts: dict[int, list[int]] = {}
        limits: dict[int, int] = {}
        shadows = []
        for seq, limit in requests:
            if seq.num_tokens + limit > self.max_model_len:
                continue
            shadow = self._sync(seq)
            shadows.append(shadow)
            drafts[shadow.seq_id], limits[shadow.seq_id] = [], limit
        pending = shadows
        while pending:
            budget, batch = self.max_num_batched_tokens, []
            for shadow in pending:
                n = min(shadow.num_uncomputed_tokens, budget)
                if n == 0:
                    break
                if not self.block_manager.can_grow(shadow, n):
                    limits[shadow.seq_id] = len(drafts[shadow.seq_id])  # the draft's cache is full: stop here
                    continue
                self.block_manager.grow(shadow, n)
                batch.append(ScheduledSequence(shadow, n))
                budget -= n
            if not batch:
                break
            for item, out in zip(batch, self.runner.step(batch)):
                shadow = item.seq
                shadow.num_computed_tokens += out.num_computed
                for token in out.tokens:
                    shadow.append_token(token)
                    drafts[shadow.seq_id].append(token)
            pending = [s for s in shadows if len(drafts[s.seq_id]) < limits[s.seq_id]]
        return [drafts.get(self.shadows[seq.seq_id][1].seq_id, []) if seq.seq_id in self.shadows else []
                for seq, _ in requests]

    def _sync(self, seq: Sequence) -> Sequence:
        """The sequence's shadow, holding its tokens, with K/V kept for their common prefix only."""
        entry = self.shadows.get(seq.seq_id)
        if entry is None:
            shadow = Sequence(seq.request_id, seq.index, seq.token_ids, _GREEDY, frozenset())
            shadow.status = SequenceStatus.RUNNING
            self.shadows[seq.seq_id] = (seq, shadow)
            return shadow
        shadow = entry[1]
        common = 0
        limit = min(len(shadow.token_ids), seq.num_tokens)
        while common < limit and shadow.token_ids[common] == seq.token_ids[common]:
            common += 1
        del shadow.token_ids[common:]
        shadow.token_ids += seq.token_ids[common:]
        # At least the last token stays to compute: its logits give the first proposal.
        shadow.num_computed_tokens = min(shadow.num_computed_tokens, common, shadow.num_tokens - 1)
        self.block_manager.trim(shadow, shadow.num_computed_tokens)
        return shadow

    def release(self, seq: Sequence) -> None:
        """The target sequence finished or was preempted: its shadow gives its blocks back."""
        entry = self.shadows.pop(seq.seq_id, None)
        if entry is not None:
            self.block_manager.release(entry[1])
            entry[1].status = SequenceStatus.FINISHED
