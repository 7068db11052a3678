"""What one forward step of the model needs to know about the sequences in it."""
from __future__ import annotations

from dataclasses import dataclass

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
