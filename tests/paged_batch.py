"""What one forward step of the model needs to know about the sequences in it."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass
class BatchContext:
    """Tokens of several sequences flattened into one batch.

    Sequence i contributes query_lens[i] new tokens; after this step its KV cache holds
    context_lens[i] tokens (the cached prefix plus the new ones).
    """

    positions: torch.Tensor  # (T,) int64 position of each new token in its sequence
    slot_mapping: torch.Tensor  # (T,) int64 flat KV-cache slot each new token is written to
    query_lens: list[int]  # (B,) new tokens per sequence, sum = T
    context_lens: list[int]  # (B,) tokens in each sequence's cache after this step
    block_tables: list[list[int]]  # (B, blocks) KV block ids of each sequence, in order
    block_size: int
    use_long_rope: torch.Tensor | None = None  # (T,) bool, only for LongRoPE models

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @cached_property
    def kernel_args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(block_tables (B, max_blocks), query_start (B+1,), context_lens (B,)) as int32 for the
        attention kernel; built once per step and shared by every layer."""
        width = max((len(t) for t in self.block_tables), default=0) or 1
        padded = [t + [0] * (width - len(t)) for t in self.block_tables]
        tables = torch.tensor(padded, dtype=torch.int32).reshape(-1, width)
        query_start = torch.zeros(len(self.query_lens) + 1, dtype=torch.int32)
        query_start[1:] = torch.tensor(self.query_lens, dtype=torch.int32).cumsum(0)
        return tables, query_start, torch.tensor(self.context_lens, dtype=torch.int32)
