"""The LoRA adapter slots of one linear layer: fixed-size buffers the `lora` op reads (shrike.ops), so a
recorded tape points at the same memory while adapters load into slots and leave them.

A linear fused from several checkpoint projections (q/k/v, gate/up) keeps one shrink matrix per part;
part p's update lands in its own output columns. Values are float32 whatever the base weights' format.
"""
from __future__ import annotations

import torch


class LoRASlots:
    def __init__(self, max_loras: int, max_rank: int, in_features: int, part_sizes: list[int]):
        parts = len(part_sizes)
        self.max_rank = max_rank
        self.shrink = torch.zeros(max_loras, parts * max_rank, in_features)  # A of part p at rows p * max_rank
        self.expand = torch.zeros(max_loras, max_rank, sum(part_sizes))  # B^T * scaling
        self.ranks = torch.zeros(max_loras, dtype=torch.int32)  # 0: the slot adds nothing
        self.part_end = torch.tensor(part_sizes, dtype=torch.int32).cumsum(0).to(torch.int32)  # (parts,)

    def write(self, slot: int, rank: int, parts: list[tuple[torch.Tensor, torch.Tensor] | None], scaling: float) -> None:
        """Slot `slot` takes an adapter of rank `rank`: per part, (A (rank, in), B (part's out, rank)) or None
        where the adapter leaves that projection alone."""
        self.clear(slot)
        begin = 0
        for p, (end, weights) in enumerate(zip(self.part_end.tolist(), parts)):
            if weights is not None:
                a, b = weights
                self.shrink[slot, p * self.max_rank:p * self.max_rank + rank] = a.float()
                self.expand[slot, :rank, begin:end] = b.float().T * scaling
            begin = end
        self.ranks[slot] = rank

    def clear(self, slot: int) -> None:
        self.ranks[slot] = 0
        self.shrink[slot] = 0
        self.expand[slot] = 0
