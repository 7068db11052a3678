"""RMSNorm through the op table resolved at load (kernel core by default)."""
from __future__ import annotations

import torch


class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float, ops):
        self.weight = weight.contiguous()  # (dim,)
        self.eps = eps
        self.ops = ops  # shrike.registry.OpTable

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        self.ops.rmsnorm(x, self.weight, out, self.eps)
        return out

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual += x (in place); returns the normalised residual. x, residual: (T, dim)."""
        out = torch.empty_like(residual)
        self.ops.add_rmsnorm(x.contiguous(), residual, self.weight, out, self.eps)
        return out
