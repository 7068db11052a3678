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
