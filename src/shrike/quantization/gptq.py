"""GPTQ: round the columns of a weight one at a time, each time moving the rounding error onto the
columns not yet rounded, in the proportions that minimise the layer's output error on calibration
inputs (Frantar et al., 2022, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers").

With H = X^T X over the calibration inputs X (tokens x K), the output error of a weight change D is
trace(D H D^T). Rounding column j by e_j is best compensated by the update -e_j / [H^-1]_jj * [H^-1]_j,:
on the later columns; the upper Cholesky factor U of H^-1 (H^-1 = U^T U) gives these updates row by
row, which is how the columns are walked here (the paper's "Cholesky reformulation").

In checkpoint order each group's scale is chosen when the walk reaches the group, from the weights as
earlier updates left them, by the same per-group search as round to nearest
(shrike.quantization.quantizer), with the error weighted by the diagonal of H. With act_order the
columns are walked by descending H_jj (the inputs that carry the most energy first, while many columns
are left to absorb their errors) and every group's scale is fixed before the walk from the contiguous
group of the original weights (llm-compressor's actorder="weight", "static groups"): either way the
groups stay contiguous and the files need no g_idx. The Hessians come from the caller
(shrike.quantization.quantize_checkpoint.sequential_gptq: decoder layer by decoder layer, from the
inputs the already quantized layers produce).
"""
from __future__ import annotations

import torch

from shrike.quantization.quantizer import one_thread, quantize_weight, round_groups
from shrike.quantization.schemes import QuantScheme

# Added to H's diagonal, as a fraction of its mean: keeps H invertible when calibration inputs are few.
DAMPING = 0.01
BLOCK = 128  # columns whose updates to the later columns are applied at once (the paper's lazy batch)


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, scheme: QuantScheme, scale_dtype: torch.dtype,
                  scale_search: str = "clip", act_order: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """weight (N, K), hessian (K, K) = sum of x x^T over calibration inputs -> integers (N, K) int8 and
    scales (N, ceil(K/G)) (per-channel: (N, 1)) in scale_dtype, the layout quantize_weight returns.
    act_order: walk the columns by descending H_jj with every group's scale fixed up front (static groups)."""
    with one_thread():
        return _gptq(weight, hessian, scheme, scale_dtype, scale_search, act_order)


def _gptq(weight: torch.Tensor, hessian: torch.Tensor, scheme: QuantScheme, scale_dtype: torch.dtype,
          scale_search: str, act_order: bool) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = weight.shape
    group = scheme.group_size or k
    w = weight.float().clone()
    h = hessian.double().clone()
    dead = torch.diagonal(h) == 0  # channels never active in the calibration text: any value rounds freely
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    importance = torch.diagonal(h).float()  # (K,)
    h += DAMPING * torch.diagonal(h).mean() * torch.eye(k, dtype=h.dtype)
    # Static groups (and one scale per row): every scale chosen before any column moves, from the weights as
    # they are, so that the walk may visit the columns in any order.
    fixed = act_order or scheme.group_size is None
    scales = quantize_weight(w, scheme, scale_dtype, scale_search, importance)[1] if fixed \
        else torch.empty(n, -(-k // group), dtype=scale_dtype)  # (N, groups); the last group may be shorter
    order = torch.argsort(importance, descending=True, stable=True) if act_order else torch.arange(k)
    upper = _inverse_cholesky(h[order][:, order])  # (K, K), in walk order
    w = w[:, order]
    values = torch.empty(n, k, dtype=torch.int8)
    block = group if scheme.group_size and not act_order else min(k, BLOCK)
    for start in range(0, k, block):
        end = min(start + block, k)
        if fixed:
            column_scales = scales.float()[:, order[start:end] // group]  # (N, B)
        else:
            _, scale = round_groups(w[:, None, start:end], importance[start:end].reshape(1, 1, -1), scheme,
                                    scale_dtype, scale_search)  # this group as earlier updates left it
            scales[:, start // group] = scale[:, 0].to(scale_dtype)
            column_scales = scale[:, :1].expand(-1, end - start)
        values[:, order[start:end]], errors = _round_block(w[:, start:end], column_scales, upper[start:end, start:end],
                                                           scheme)
        w[:, end:] -= errors @ upper[start:end, end:]
    return values, scales


def _inverse_cholesky(h: torch.Tensor) -> torch.Tensor:
    """(K, K) the upper Cholesky factor U of H^-1 (H^-1 = U^T U), in fp32."""
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True).float()


def _round_block(w: torch.Tensor, scales: torch.Tensor, u: torch.Tensor, scheme: QuantScheme
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns w (N, B) rounded one at a time with column scales (N, B), each error spread over the block's
    later columns by u (B, B): integers (N, B) int8 and the scaled errors (N, B) the columns after it receive."""
    cols = w.clone()
    values = torch.empty(cols.shape, dtype=torch.int8)
    errors = torch.empty_like(cols)
    for i in range(cols.shape[1]):
        q = torch.round(cols[:, i] / scales[:, i]).clamp(-scheme.max_level - 1, scheme.max_level)
        values[:, i] = q.to(torch.int8)
        errors[:, i] = (cols[:, i] - q * scales[:, i]) / u[i, i]
        cols[:, i:] -= errors[:, i, None] * u[i, i:][None, :]
    return values, errors
