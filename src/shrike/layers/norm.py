"""RMSNorm through the step's op table (kernel core by default)."""
from __future__ import annotations

import torch


class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float):
        self.weight = weight.contiguous()  # (dim,)
        self.eps = eps

    def __call__(self, step, x, rows):
        """x (rows, dim) -> rmsnorm(x) * weight, a new (rows, dim) activation."""
        out = step.empty(rows, self.weight.shape[0], dtype=x.dtype)
        step.ops.rmsnorm(x, self.weight, out, self.eps)
        return out

    def add_and_norm(self, step, x, residual, rows):
        """residual += x (in place); returns the normalised residual, (rows, dim)."""
        out = step.empty(rows, self.weight.shape[0], dtype=residual.dtype)
        step.ops.add_rmsnorm(x, residual, self.weight, out, self.eps)
        return out
