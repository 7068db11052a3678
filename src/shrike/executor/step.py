"""What a model's forward sees of one engine step: the op table, the step's inputs, and where its
activations live. The model asks the step for everything that depends on the batch, so one forward
definition serves both the eager run and the recording (shrike.executor.tape).

A forward allocates its activations with `step.empty(rows, *columns, dtype=...)`, where rows is
`step.tokens` (one row per new token) or `step.logits` (one row per token whose logits are wanted),
calls ops from `step.ops` with the calling conventions of shrike.ops, and reshapes only with
`.view(rows, *columns)`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class EagerStep:
    """A step whose ops run at once on torch tensors (the reference path, and any model whose
    forward is not recorded)."""

    ops: object  # shrike.registry.OpTable
    token_ids: torch.Tensor  # (T,) int64
    positions: torch.Tensor  # (T,) int64 position of each new token in its sequence
    slot_mapping: torch.Tensor  # (T,) int64 KV-cache slot each new token is written to
    attention: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # block tables (B, W), query_start (B+1,), context_lens (B,) int32
    block_size: int
    logits_rows: torch.Tensor  # (L,) int64 rows of T whose logits are wanted
    use_long_rope: torch.Tensor | None = None  # (T,) bool, LongRoPE models only
    lora_slots: torch.Tensor | None = None  # (T,) int32 LoRA adapter slot of each token, -1: none (LoRA on only)

    @property
    def tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def logits(self) -> int:
        return int(self.logits_rows.shape[0])

    def empty(self, rows: int, *columns: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(rows, *columns, dtype=dtype)

    def rope(self, rotary) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) (T, head_dim) float32 of `rotary` (shrike.layers.rotary.RotaryEmbedding) at the tokens' positions."""
        return rotary.cos_sin_for(self.positions, self.use_long_rope)

    def take_logits_rows(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, width) -> a copy of its rows that need logits, (L, width)."""
        return x[self.logits_rows].contiguous()

    @classmethod
    def prefill(cls, ops, token_ids: torch.Tensor, block_size: int, logits_rows: torch.Tensor,
                long_threshold: int | None = None, lora_slot: int = -1) -> "EagerStep":
        """One sequence of token_ids (T,) from an empty cache whose blocks are 0, 1, 2, ... in order
        (perplexity, and tests that call a model's forward directly), every token on LoRA slot `lora_slot`."""
        n = int(token_ids.shape[0])
        blocks = -(-n // block_size)
        return cls(ops=ops, token_ids=token_ids.to(torch.int64), positions=torch.arange(n),
                   slot_mapping=torch.arange(n), block_size=block_size,
                   attention=(torch.arange(blocks, dtype=torch.int32).reshape(1, blocks),
                              torch.tensor([0, n], dtype=torch.int32), torch.tensor([n], dtype=torch.int32)),
                   logits_rows=logits_rows.to(torch.int64),
                   use_long_rope=None if long_threshold is None else torch.full((n,), n > long_threshold),
                   lora_slots=torch.full((n,), lora_slot, dtype=torch.int32))
