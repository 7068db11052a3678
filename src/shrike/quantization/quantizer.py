"""Symmetric round-to-nearest weight quantization with a per-group scale search.

The integers of a symmetric b-bit scheme span [-L - 1, L] (L = 2^(b-1) - 1). Mapping a group's
largest magnitude onto L (scale = absmax / L) leaves the level -L - 1 unused and makes every step
coarser than needed; llm-compressor's min-max rule (absmax / (L + 0.5)) uses all 2^b levels at the
price of clipping a positive extreme by half a step. Which is better differs from group to group, so
the default `mse` search tries several divisors of absmax between L and L + 1 and, for each, also the
least-squares refit of the scale to the integers it produced (llama.cpp's quantizers do the same
refit), and keeps per group the pair with the smallest error. llm-compressor's choice is one of the
candidates, so the result is never worse than it in that error. `clip` (the default) adds candidates
that shrink the range further, down to 0.55 of min-max (trading clipped outliers for finer steps).

The searches pay off only when the error is weighted by calibration inputs. Unweighted, they help
SmolLM2-135M (W4A16 g64, perplexity on two texts: llm-compressor 31.22 / 11.69, mse 31.21 / 10.79,
clip 29.96 / 10.11) but hurt Gemma 3 270M, whose inputs put most of a layer's output error on a few
channels (W4A16 g128, Bill of Rights: min-max 11.63, mse 16.66); weighted by calibration they beat
min-max on both (Gemma W4A8 g128: min-max 12.40, weighted clip 7.56). So `shrike quantize` uses
min-max without calibration and the weighted clip search with it.

The error of a group is sum_k E[x_k^2] (w_k - w'_k)^2: the expected squared output error for inputs
with per-channel second moments E[x_k^2] (from calibration text) and no cross-channel correlation;
without calibration all E[x_k^2] are equal and it is the weight reconstruction error.

Scales are rounded to the checkpoint's scale dtype before the integers are chosen, so the stored
integers are the nearest ones for the scale a reader will actually multiply by.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from shrike.quantization.schemes import QuantScheme

# Fractions of a step added to L: absmax / (L + f). 0.5 is llm-compressor's min-max rule.
_STEP_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
CLIP_RATIOS = tuple(1.0 - 0.05 * i for i in range(1, 10))  # 0.95 down to 0.55 of the min-max range
SCALE_SEARCHES = ("minmax", "absmax", "mse", "clip")
_ROWS_PER_CHUNK = 256


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Quantizing runs many small tensor ops, which torch's thread pool slows down instead of speeding up
    when other work shares the cores (a 1536 x 576 layer: 0.3 s on one thread, 26 s on two of a busy
    2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _divisors(max_level: int, search: str) -> list[float]:
    if search == "absmax":
        return [float(max_level)]
    if search == "minmax":
        return [max_level + 0.5]
    divisors = [max_level + f for f in _STEP_FRACTIONS]
    if search == "clip":
        divisors += [(max_level + 0.5) / ratio for ratio in CLIP_RATIOS]
    return divisors


def _stored(scale: torch.Tensor, scale_dtype: torch.dtype) -> torch.Tensor:
    scale = scale.to(scale_dtype).float()
    # An all-zero group quantizes to zeros under any scale; 1 keeps readers from dividing by 0.
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def quantize_weight(weight: torch.Tensor, scheme: QuantScheme, scale_dtype: torch.dtype, scale_search: str = "minmax",
                    input_power: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """weight (N, K) -> integers (N, K) int8 and scales (N, ceil(K/G)) (per-channel: (N, 1)) in scale_dtype.

    When G does not divide K the last group of each row is shorter (as compressed-tensors writes it).
    scale_search: "minmax" (llm-compressor's absmax / (L + 0.5)), "absmax" (absmax / L, nothing clipped),
    "mse" or "clip" (see the module doc).
    input_power: (K,) mean squared input of each input channel, weighting the search's error.
    """
    n, k = weight.shape
    group = scheme.group_size or k
    groups = -(-k // group)
    pad = groups * group - k  # zero weights of zero importance: they change no group's absmax or error
    importance = input_power.float() if input_power is not None else torch.ones(k)
    importance = torch.nn.functional.pad(importance, (0, pad)).reshape(1, groups, group)
    values = torch.empty(n, k, dtype=torch.int8)
    scales = torch.empty(n, groups, dtype=scale_dtype)
    with one_thread():
        for start in range(0, n, _ROWS_PER_CHUNK):
            w = torch.nn.functional.pad(weight[start:start + _ROWS_PER_CHUNK].float(), (0, pad))
            q, scale = round_groups(w.reshape(-1, groups, group), importance, scheme, scale_dtype, scale_search,
                                    weight.dtype if scale_search == "minmax" else torch.float32)
            values[start:start + _ROWS_PER_CHUNK] = q.reshape(-1, groups * group)[:, :k].to(torch.int8)
            scales[start:start + _ROWS_PER_CHUNK] = scale.to(scale_dtype)
    return values, scales


def round_groups(w: torch.Tensor, importance: torch.Tensor, scheme: QuantScheme, scale_dtype: torch.dtype,
                 scale_search: str, quotient_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """w (rows, groups, G) fp32, importance broadcastable to it -> integers (rows, groups, G) as fp32 and
    scales (rows, groups) fp32 holding scale_dtype values: per group the candidate with the smallest error.

    quotient_dtype: w / scale is rounded to it before rounding to an integer. compressed-tensors divides
    bf16 weights in bf16, so "minmax" does the same to write its integers bit for bit; that double
    rounding moves a few weights to the farther level, and 4-bit perplexity of a small model is so
    sensitive that it shows (SmolLM2 W4A8-G64, Declaration: 31.99 as the library rounds, 34.26 exactly)."""
    if scale_search not in SCALE_SEARCHES:
        raise ValueError(f"scale_search must be one of {SCALE_SEARCHES}, not {scale_search!r}")
    lowest, highest = -scheme.max_level - 1, scheme.max_level
    absmax = w.abs().amax(dim=-1)  # (rows, groups)
    best_error = best_scale = best_q = None
    for divisor in _divisors(scheme.max_level, scale_search):
        scale = _stored(absmax / divisor, scale_dtype)
        candidates = [scale]
        if scale_search in ("mse", "clip"):
            q = torch.round(w / scale[..., None]).clamp(lowest, highest)
            qq = (importance * q.square()).sum(dim=-1)
            refit = (importance * w * q).sum(dim=-1) / torch.where(qq > 0, qq, torch.ones_like(qq))
            candidates.append(_stored(refit, scale_dtype))
        for scale in candidates:
            q = torch.round((w / scale[..., None]).to(quotient_dtype).float()).clamp(lowest, highest)
            error = ((w - q * scale[..., None]).square() * importance).sum(dim=-1)  # (rows, groups)
            if best_error is None:
                best_error, best_scale, best_q = error, scale, q
                continue
            better = error < best_error
            best_error = torch.where(better, error, best_error)
            best_scale = torch.where(better, scale, best_scale)
            best_q = torch.where(better[..., None], q, best_q)
    return best_q, best_scale


def dequantize(values: torch.Tensor, scales: torch.Tensor, group_size: int | None = None) -> torch.Tensor:
    """(N, K) int8 and (N, ceil(K/G)) scales -> (N, K) fp32; group_size needed only when G does not divide K."""
    n, k = values.shape
    group = group_size or k // scales.shape[1]
    return values.float() * scales.float().repeat_interleave(group, dim=1)[:, :k]
