"""Runs one scheduled step: builds the flat batch, calls the model, samples."""
from __future__ import annotations

import torch

from shrike.engine.batch import BatchContext
from shrike.engine.scheduler import ScheduledSequence
from shrike.engine.sequence import Sequence
from shrike.layers.attention import KVCache
from shrike.model.llama import CausalLM
from shrike.sampling.sampler import sample, top_logprobs


class ModelRunner:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int, kv_dtype: torch.dtype):
        c = model.config
        self.model = model
        self.block_size = block_size
        self.kv_caches = [KVCache(num_blocks, block_size, c.num_kv_heads, c.head_dim, kv_dtype) for _ in range(c.num_layers)]
        self.long_rope_threshold = model.rotary.long_threshold

    def _slots(self, block_table: list[int], start: int, count: int) -> list[int]:
        bs = self.block_size
        return [block_table[p // bs] * bs + p % bs for p in range(start, start + count)]

    @torch.inference_mode()
    def step(self, batch: list[ScheduledSequence]) -> None:
        """Computes the scheduled tokens; sequences that reach their end get a sampled token."""
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        use_long: list[bool] = []
        logits_rows: list[int] = []  # rows whose logits are needed
        samplers: list[tuple[int, Sequence]] = []  # (row in logits, sequence) that get a new token
        prompt_rows: list[tuple[Sequence, int, int, int]] = []  # (sequence, first logits row, first position, count)
        for item in batch:
            seq, n = item.seq, item.num_tokens
            start = seq.num_computed_tokens
            row0 = len(input_ids)
            input_ids += seq.token_ids[start:start + n]
            positions += range(start, start + n)
            slots += self._slots(seq.block_table, start, n)
            if self.long_rope_threshold is not None:
                use_long += [start + n > self.long_rope_threshold] * n
            # A sequence recomputed after preemption already has its prompt logprobs.
            if seq.params.prompt_logprobs is not None and start < seq.num_prompt_tokens - 1 \
                    and len(seq.prompt_logprobs) == start + 1:
                # Logits at position p score prompt token p + 1.
                count = min(start + n, seq.num_prompt_tokens - 1) - start
                prompt_rows.append((seq, len(logits_rows), start, count))
                logits_rows += range(row0, row0 + count)
            if start + n == seq.num_tokens:
                if logits_rows and logits_rows[-1] == row0 + n - 1:
                    samplers.append((len(logits_rows) - 1, seq))
                else:
                    samplers.append((len(logits_rows), seq))
                    logits_rows.append(row0 + n - 1)
        ctx = BatchContext(
            positions=torch.tensor(positions, dtype=torch.int64),
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            query_lens=[item.num_tokens for item in batch],
            context_lens=[item.seq.num_computed_tokens + item.num_tokens for item in batch],
            block_tables=[item.seq.block_table for item in batch],
            block_size=self.block_size,
            use_long_rope=torch.tensor(use_long) if use_long else None,
        )
        logits = self.model.forward(torch.tensor(input_ids, dtype=torch.int64), ctx, self.kv_caches,
                                    torch.tensor(logits_rows, dtype=torch.int64))  # (rows, vocab)
        for seq, row, start, count in prompt_rows:
            targets = torch.tensor(seq.token_ids[start + 1:start + 1 + count], dtype=torch.int64)
            lp = torch.log_softmax(logits[row:row + count], dim=-1)
            seq.prompt_logprobs += top_logprobs(lp, targets, seq.params.prompt_logprobs)
        for item in batch:
            item.seq.num_computed_tokens += item.num_tokens
        if samplers:
            rows = torch.tensor([r for r, _ in samplers], dtype=torch.int64)
            tokens, logprobs = sample(logits[rows], [seq.sampling_row for _, seq in samplers])
            for (_, seq), token, lp in zip(samplers, tokens.tolist(), logprobs):
                seq.append_token(token)
                if lp is not None:
                    seq.output_logprobs.append(lp)
