"""The int8 KV-cache row layout (csrc/attention/kv_int8.h) in PyTorch, for the reference ops and tests.

Each (token, KV head) row is head_dim int8 values followed by the 4 bytes of their float32 scale:
value_i = q_i * scale, scale = max|x| / 127 per row, q = round-half-even(x / scale). A row costs
head_dim + 4 bytes instead of 2 * head_dim in bfloat16.
"""
from __future__ import annotations

import torch

SCALE_BYTES = 4


def row_bytes(head_dim: int) -> int:
    """int8 elements of one (token, KV head) row."""
    return head_dim + SCALE_BYTES


def quantize(x: torch.Tensor) -> torch.Tensor:
    """x (..., head_dim) -> rows (..., head_dim + 4) int8; the same bits as the C++ kernels write."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True) / 127.0  # (..., 1) float32
    q = torch.where(scale > 0, torch.round(x / scale), torch.zeros_like(x)).clamp_(-127, 127).to(torch.int8)
    return torch.cat([q, scale.contiguous().view(torch.int8)], dim=-1)


def dequantize(rows: torch.Tensor) -> torch.Tensor:
    """rows (..., head_dim + 4) int8 -> (..., head_dim) float32 values q * scale."""
    head_dim = rows.shape[-1] - SCALE_BYTES
    scale = rows[..., head_dim:].contiguous().view(torch.float32)  # (..., 1)
    return rows[..., :head_dim].float() * scale
