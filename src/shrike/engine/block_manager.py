"""Hands out fixed-size KV-cache blocks to sequences and takes them back."""
from __future__ import annotations

from collections import deque

from shrike.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def extra_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        return max(0, self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table))

    def can_grow(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.extra_blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def grow(self, seq: Sequence, num_new_tokens: int) -> None:
        for _ in range(self.extra_blocks_needed(seq, num_new_tokens)):
            seq.block_table.append(self.free_blocks.popleft())

    def release(self, seq: Sequence) -> None:
        self.free_blocks.extend(seq.block_table)
        seq.block_table = []
        seq.num_computed_tokens = 0
