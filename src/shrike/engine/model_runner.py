"""Runs one scheduled step: fills the step inputs, calls the model, samples.

The runner reads sequences and never changes them: it returns what it computed (a
`SequenceOutput` per scheduled sequence) and the scheduler applies it (`Scheduler.postprocess`).

The model's forward is recorded once into an op tape that the C++ executor replays each step
(shrike.executor); its step inputs live in persistent buffers the executor points into: each running
sequence owns a row of the block-table buffer, written only when the sequence gains blocks. With the
compiled forward turned off, or every op on its PyTorch reference, the forward runs eagerly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shrike.engine.pooling import PooledChunk, pool_chunk
from shrike.engine.scheduler import ScheduledSequence
from shrike.engine.sequence import Sequence, SequenceStatus
from shrike.executor.compile import CompiledTape, StepBuffers
from shrike.executor.step import EagerStep
from shrike.executor.tape import record
from shrike.layers.attention import KVCache
from shrike.sampling.sampler import TokenLogprobs, sample, top_logprobs
from shrike.sampling.verify import verify


@dataclass
class SequenceOutput:
    """What one step computed for one scheduled sequence."""

    num_computed: int  # tokens whose K/V this step wrote and that stay (rejected proposals excluded)
    tokens: list[int] = field(default_factory=list)  # new tokens, when the step reached the end of the sequence
    logprobs: list[TokenLogprobs] | None = None  # of each new token, when asked for
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)  # for the prompt tokens this step scored
    pooled: PooledChunk | None = None  # a pooled (embedding) sequence's part of its vector from this step


@dataclass
class _TableRow:
    row: int
    seq: Sequence
    table: list[int]  # the sequence's block_table list this row mirrors (replaced on release)
    written: int  # leading entries already copied


class ModelRunner:
    def __init__(self, model, num_blocks: int, block_size: int, kv_dtype: torch.dtype,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 512, max_model_len: int | None = None,
                 compile: bool = True, output: str = "logits", lora: bool = False):
        """output: "logits" (generation) or "hidden" (the pooling runner: steps yield the final hidden states
        of the rows pooling reads, and no token is sampled). lora: the model's linears have adapter slots
        (shrike.engine.lora), and each step says which slot every token's sequence uses."""
        c = model.config
        self.output = output
        self.lora = lora
        self.model = model
        self.block_size = block_size
        self.kv_caches = [KVCache(num_blocks, block_size, c.num_kv_heads, c.head_dim, kv_dtype) for _ in range(c.num_layers)]
        self.long_rope_threshold = model.rotary.long_threshold
        self.compiled: CompiledTape | None = None
        self.eager_reason = None if compile else "compiled forward turned off"
        if compile:
            tape = record(model, self.kv_caches, block_size, output)
            if not any(model.ops.is_builtin(e.op) for e in tape.entries if e.op != "gather_rows"):
                self.eager_reason = "every op runs its PyTorch reference (--kernel-backend reference or plugins)"
        if self.eager_reason is None:
            max_blocks = -(-(max_model_len or c.max_position_embeddings) // block_size)
            self.buffers = StepBuffers.allocate(max_num_batched_tokens, max_num_seqs, max_blocks)
            self._token_ids = self.buffers.token_ids.numpy()
            self._seqs = self.buffers.seqs.numpy()
            self._tables = self.buffers.block_tables.numpy()
            self._logits_rows = self.buffers.logits_rows.numpy()
            self._lora_slots = self.buffers.lora_slots.numpy()
            self._rows: dict[int, _TableRow] = {}  # seq_id -> its block-table row
            self._free_rows = list(range(max_num_seqs - 1, -1, -1))
            self.compiled = CompiledTape(tape, model.ops, self.buffers, block_size, self.kv_caches[0].key.shape[0],
                                         c.vocab_size)

    @torch.inference_mode()
    def step(self, batch: list[ScheduledSequence]) -> list[SequenceOutput]:
        """Computes the scheduled tokens -> one output per scheduled sequence, in batch order."""
        if self.output == "hidden":
            return self._pool(batch)
        logits_rows: list[int] = []  # token rows whose logits are needed
        samplers: list[tuple[int, int]] = []  # (row in logits, index in batch) of sequences that get a token
        prompt_rows: list[tuple[int, int, int, int]] = []  # (index in batch, first logits row, first position, count)
        verifiers: list[tuple[int, int]] = []  # (index in batch, first logits row) of sequences with a draft
        row0 = 0
        for b, item in enumerate(batch):
            seq, n = item.seq, item.num_tokens
            start = seq.num_computed_tokens
            if item.draft:  # every position's logits: each scores the proposal after it
                verifiers.append((b, len(logits_rows)))
                logits_rows += range(row0, row0 + n)
                row0 += n
                continue
            # A sequence recomputed after preemption already has its prompt logprobs.
            if seq.params.prompt_logprobs is not None and start < seq.num_prompt_tokens - 1 \
                    and len(seq.prompt_logprobs) == start + 1:
                # Logits at position p score prompt token p + 1.
                count = min(start + n, seq.num_prompt_tokens - 1) - start
                prompt_rows.append((b, len(logits_rows), start, count))
                logits_rows += range(row0, row0 + count)
            if start + n == seq.num_tokens:
                if logits_rows and logits_rows[-1] == row0 + n - 1:
                    samplers.append((len(logits_rows) - 1, b))
                else:
                    samplers.append((len(logits_rows), b))
                    logits_rows.append(row0 + n - 1)
            row0 += n
        if self.compiled is not None:
            logits = self._run_compiled(batch, row0, logits_rows)
        else:
            logits = self._run_eager(batch, logits_rows)  # (rows, vocab)

        outputs = [SequenceOutput(item.num_tokens) for item in batch]
        for b, row, start, count in prompt_rows:
            seq = batch[b].seq
            targets = torch.tensor(seq.token_ids[start + 1:start + 1 + count], dtype=torch.int64)
            lp = torch.log_softmax(logits[row:row + count], dim=-1)
            outputs[b].prompt_logprobs = top_logprobs(lp, targets, seq.params.prompt_logprobs)
        if samplers:
            rows = [r for r, _ in samplers]
            picked = logits if rows == list(range(len(logits_rows))) else logits[torch.tensor(rows, dtype=torch.int64)]
            tokens, logprobs = sample(picked, [batch[b].seq.sampling_row for _, b in samplers])
            for (_, b), token, lp in zip(samplers, tokens.tolist(), logprobs):
                outputs[b].tokens, outputs[b].logprobs = [token], None if lp is None else [lp]
        if verifiers:
            drafts = [batch[b].draft for b, _ in verifiers]
            rows = torch.cat([torch.arange(r, r + len(d) + 1) for (_, r), d in zip(verifiers, drafts)])
            verified = verify(logits[rows], [batch[b].seq.sampling_row for b, _ in verifiers], drafts,
                              [None] * len(drafts))
            for (b, _), result in zip(verifiers, verified):
                out = outputs[b]
                out.tokens, out.logprobs = result.tokens, result.logprobs
                out.num_computed = batch[b].num_tokens - len(batch[b].draft) + result.num_accepted
        return outputs

    def _pool(self, batch: list[ScheduledSequence]) -> list[SequenceOutput]:
        """A pooling step: the hidden states of the rows each sequence's pooling reads, folded per sequence."""
        rows: list[int] = []
        reads: list[tuple[int, int, bool, bool]] = []  # (first row in hidden, count, holds row 0, holds the last)
        row0 = 0
        for item in batch:
            seq, n = item.seq, item.num_tokens
            start, pooler = seq.num_computed_tokens, seq.pooling.pooler
            first, last = start == 0, start + n == seq.num_tokens
            begin = len(rows)
            if pooler.needs_every_row:
                rows += range(row0, row0 + n)
            else:
                rows += [row0] if first and "cls" in pooler.modes else []
                rows += [row0 + n - 1] if last and "last" in pooler.modes and (n > 1 or not rows[begin:]) else []
            reads.append((begin, len(rows) - begin, first, last))
            row0 += n
        hidden = self._run_compiled(batch, row0, rows) if self.compiled is not None else self._run_eager(batch, rows)
        outputs = []
        for item, (begin, count, first, last) in zip(batch, reads):
            out = SequenceOutput(item.num_tokens)
            if count:
                out.pooled = pool_chunk(item.seq.pooling.pooler, hidden[begin:begin + count],
                                        item.seq.num_computed_tokens, item.num_tokens, first, last)
            else:
                out.pooled = PooledChunk(item.seq.num_computed_tokens, item.num_tokens)
            outputs.append(out)
        return outputs

    # Compiled forward -------------------------------------------------------------------------

    def _table_row(self, seq: Sequence) -> int:
        """The sequence's row of the block-table buffer, brought up to date with its block table."""
        entry = self._rows.get(seq.seq_id)
        if entry is None:
            if not self._free_rows:
                self._reclaim_rows()
            entry = self._rows[seq.seq_id] = _TableRow(self._free_rows.pop(), seq, seq.block_table, 0)
        elif entry.table is not seq.block_table:  # released (preempted) and given new blocks since
            entry.table, entry.written = seq.block_table, 0
        table = seq.block_table
        if len(table) > entry.written:
            self._tables[entry.row, entry.written:len(table)] = table[entry.written:]
            entry.written = len(table)
        return entry.row

    def _reclaim_rows(self) -> None:
        """Rows of sequences that stopped running (finished, aborted, preempted) become free."""
        for seq_id, entry in list(self._rows.items()):
            if entry.seq.status != SequenceStatus.RUNNING:
                del self._rows[seq_id]
                self._free_rows.append(entry.row)

    def _run_compiled(self, batch: list[ScheduledSequence], num_tokens: int, logits_rows: list[int]) -> torch.Tensor:
        token_ids, seqs = self._token_ids, self._seqs
        t = 0
        for b, item in enumerate(batch):
            seq, n = item.seq, item.num_tokens
            start = seq.num_computed_tokens
            if n == 1:
                token_ids[t] = seq.token_ids[start]
            elif item.draft:
                token_ids[t:t + n] = seq.token_ids[start:] + item.draft
            else:
                token_ids[t:t + n] = seq.token_ids[start:start + n]
            seqs[b] = (self._table_row(seq), start, n)
            if self.lora:
                self._lora_slots[t:t + n] = -1 if seq.lora is None else seq.lora.slot
            t += n
        self._logits_rows[:len(logits_rows)] = logits_rows
        return self.compiled.run(len(batch), num_tokens, len(logits_rows))

    # Eager forward ----------------------------------------------------------------------------

    def _slots(self, block_table: list[int], start: int, count: int) -> list[int]:
        bs = self.block_size
        return [block_table[p // bs] * bs + p % bs for p in range(start, start + count)]

    def _run_eager(self, batch: list[ScheduledSequence], logits_rows: list[int]) -> torch.Tensor:
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        use_long: list[bool] = []
        for item in batch:
            seq, n = item.seq, item.num_tokens
            start = seq.num_computed_tokens
            input_ids += seq.token_ids[start:start + n - len(item.draft)] + item.draft
            positions += range(start, start + n)
            slots += self._slots(seq.block_table, start, n)
            if self.long_rope_threshold is not None:
                use_long += [start + n > self.long_rope_threshold] * n
        query_lens = [item.num_tokens for item in batch]
        width = max((len(item.seq.block_table) for item in batch), default=0) or 1
        tables = torch.tensor([item.seq.block_table + [0] * (width - len(item.seq.block_table)) for item in batch],
                              dtype=torch.int32).reshape(-1, width)  # (B, width)
        query_start = torch.zeros(len(batch) + 1, dtype=torch.int32)
        query_start[1:] = torch.tensor(query_lens, dtype=torch.int32).cumsum(0)
        context_lens = torch.tensor([item.seq.num_computed_tokens + item.num_tokens for item in batch], dtype=torch.int32)
        step = EagerStep(
            ops=self.model.ops,
            token_ids=torch.tensor(input_ids, dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64),
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            attention=(tables, query_start, context_lens),
            block_size=self.block_size,
            logits_rows=torch.tensor(logits_rows, dtype=torch.int64),
            use_long_rope=torch.tensor(use_long) if use_long else None,
            lora_slots=torch.tensor([-1 if item.seq.lora is None else item.seq.lora.slot for item in batch
                                     for _ in range(item.num_tokens)], dtype=torch.int32) if self.lora else None,
        )
        if self.output == "hidden":
            return self.model.forward(step, self.kv_caches, output="hidden")
        return self.model.forward(step, self.kv_caches)
