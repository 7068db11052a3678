"""RMSNorm through whichever implementation the op registry resolved (kernel core by default)."""
from __future__ import annotations

from collections.abc import Callable

import torch

from shrike import _C

# (x, weight, out, eps) -> None, writing out
RmsNormFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], None]


class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float, kernel: RmsNormFn = _C.rmsnorm):
        self.weight = weight.contiguous()  # (dim,)
        self.eps = eps
        self.kernel = kernel

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        self.kernel(x, self.weight, out, self.eps)
        return out

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual += x (in place); returns the normalised residual. x, residual: (T, dim)."""
        out = torch.empty_like(residual)
        if self.kernel is _C.rmsnorm:
            _C.add_rmsnorm(x.contiguous(), residual, self.weight, out, self.eps)
        else:
            residual += x
            self.kernel(residual, self.weight, out, self.eps)
        return out
