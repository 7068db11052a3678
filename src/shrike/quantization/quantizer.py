"""Round-to-nearest symmetric weight quantization, with an optional per-group clipping search.

Scales are rounded to the checkpoint's scale dtype before the integers are chosen, so the stored
integers are the nearest ones for the scale a reader will actually multiply by.

The clipping search tries shrinking each group's range (trading clipped outliers for finer
steps) and keeps the ratio with the smallest output error. For inputs x with per-channel second
moments E[x_k^2] and no cross-channel correlation, the expected squared output error of a group
is sum_k E[x_k^2] (w_k - w'_k)^2, which is what is minimised; without calibration statistics
all E[x_k^2] are equal and this is the weight reconstruction error.
"""
from __future__ import annotations

import torch

from shrike.quantization.schemes import QuantScheme

CLIP_RATIOS = tuple(1.0 - 0.025 * i for i in range(20))  # 1.0 down to 0.525
_ROWS_PER_CHUNK = 256


def _scales(absmax: torch.Tensor, ratio: float, max_level: int, scale_dtype: torch.dtype) -> torch.Tensor:
    scale = (absmax * ratio / max_level).to(scale_dtype).float()
    # An all-zero group quantizes to zeros under any scale; 1 keeps readers from dividing by 0.
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def quantize_weight(weight: torch.Tensor, scheme: QuantScheme, scale_dtype: torch.dtype, clip_search: bool = False,
                    input_power: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """weight (N, K) -> integers (N, K) int8 and scales (N, K/G) (per-channel: (N, 1)) in scale_dtype.

    input_power: (K,) mean squared input of each input channel, weighting the clipping search.
    """
    n, k = weight.shape
    group = scheme.group_size or k
    lowest, highest = -scheme.max_level - 1, scheme.max_level
    ratios = CLIP_RATIOS if clip_search else (1.0,)
    importance = (input_power.float() if input_power is not None else torch.ones(k)).reshape(1, k // group, group)
    values = torch.empty(n, k, dtype=torch.int8)
    scales = torch.empty(n, k // group, dtype=scale_dtype)
    for start in range(0, n, _ROWS_PER_CHUNK):
        w = weight[start:start + _ROWS_PER_CHUNK].float().reshape(-1, k // group, group)  # (rows, K/G, G)
        absmax = w.abs().amax(dim=-1)  # (rows, K/G)
        best_error = best_scale = best_q = None
        for ratio in ratios:
            scale = _scales(absmax, ratio, scheme.max_level, scale_dtype)  # (rows, K/G) fp32
            q = torch.round(w / scale[..., None]).clamp(lowest, highest)  # (rows, K/G, G)
            error = ((w - q * scale[..., None]).square() * importance).sum(dim=-1)  # (rows, K/G)
            if best_error is None:
                best_error, best_scale, best_q = error, scale, q
            else:
                better = error < best_error
                best_error = torch.where(better, error, best_error)
                best_scale = torch.where(better, scale, best_scale)
                best_q = torch.where(better[..., None], q, best_q)
        values[start:start + _ROWS_PER_CHUNK] = best_q.reshape(-1, k).to(torch.int8)
        scales[start:start + _ROWS_PER_CHUNK] = best_scale.to(scale_dtype)
    return values, scales


def dequantize(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(N, K) int8 and (N, K/G) scales -> (N, K) fp32."""
    n, k = values.shape
    return (values.float().reshape(n, scales.shape[1], -1) * scales.float()[..., None]).reshape(n, k)
