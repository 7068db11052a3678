"""GPTQ: round the columns of a weight one at a time, each time moving the rounding error onto the
columns not yet rounded, in the proportions that minimise the layer's output error on calibration
inputs (Frantar et al., 2022, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers").

With H = X^T X over the calibration inputs X (tokens x K), the output error of a weight change D is
trace(D H D^T). Rounding column j by e_j is best compensated by the update -e_j / [H^-1]_jj * [H^-1]_j,:
on the later columns; the upper Cholesky factor U of H^-1 (H^-1 = U^T U) gives these updates row by
row, which is how the columns are walked here (the paper's "Cholesky reformulation").

Each group's scale is chosen when the walk reaches the group, from the weights as earlier updates left
them, by the same per-group search as round to nearest (shrike.quantization.quantizer), with the error
weighted by the diagonal of H. Columns are walked in checkpoint order (no act-order), so the groups
stay contiguous and the files need no g_idx. Hessians here come from the unquantized model's inputs for
every layer at once, not layer by layer from the already quantized layers before it as llm-compressor
does; on a 135M-parameter model the difference did not matter as much as the calibration text did.
"""
from __future__ import annotations

import torch

from shrike.quantization.quantizer import one_thread, round_groups
from shrike.quantization.schemes import QuantScheme

# Added to H's diagonal, as a fraction of its mean: keeps H invertible when calibration inputs are few.
DAMPING = 0.01


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, scheme: QuantScheme, scale_dtype: torch.dtype,
                  scale_search: str = "clip") -> tuple[torch.Tensor, torch.Tensor]:
    """weight (N, K), hessian (K, K) = sum of x x^T over calibration inputs -> integers (N, K) int8 and
    scales (N, ceil(K/G)) (per-channel: (N, 1)) in scale_dtype, the layout quantize_weight returns."""
    with one_thread():
        return _gptq(weight, hessian, scheme, scale_dtype, scale_search)


def _gptq(weight: torch.Tensor, hessian: torch.Tensor, scheme: QuantScheme, scale_dtype: torch.dtype,
          scale_search: str) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = weight.shape
    group = scheme.group_size or k
    w = weight.float().clone()
    h = hessian.double().clone()
    dead = torch.diagonal(h) == 0  # channels never active in the calibration text: any value rounds freely
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    importance = torch.diagonal(h).float()
    h += DAMPING * torch.diagonal(h).mean() * torch.eye(k, dtype=h.dtype)
    upper = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True).float()  # (K, K)

    values = torch.empty(n, k, dtype=torch.int8)
    scales = torch.empty(n, -(-k // group), dtype=scale_dtype)  # the last group of a row may be shorter
    lowest, highest = -scheme.max_level - 1, scheme.max_level
    block = group if scheme.group_size else min(k, 128)
    if scheme.group_size is None:  # one scale per row, chosen before any column moves
        _, row_scale = round_groups(w[:, None, :], importance.reshape(1, 1, k), scheme, scale_dtype, scale_search)
        scales[:] = row_scale.to(scale_dtype)
    for start in range(0, k, block):
        end = min(start + block, k)
        cols = w[:, start:end].clone()  # (N, B), receives the updates from columns of this block
        errors = torch.empty_like(cols)
        u = upper[start:end, start:end]
        if scheme.group_size is None:
            scale = scales[:, 0].float()
        else:
            _, scale = round_groups(cols[:, None, :], importance[start:end].reshape(1, 1, -1), scheme,
                                    scale_dtype, scale_search)
            scale = scale[:, 0]
            scales[:, start // group] = scale.to(scale_dtype)
        for i in range(end - start):
            q = torch.round(cols[:, i] / scale).clamp(lowest, highest)
            values[:, start + i] = q.to(torch.int8)
            error = (cols[:, i] - q * scale) / u[i, i]
            cols[:, i:] -= error[:, None] * u[i, i:][None, :]
            errors[:, i] = error
        w[:, end:] -= errors @ upper[start:end, end:]
    return values, scales
