"""The lm_head: final hidden states of the rows that need logits -> fp32 logits.

By default it keeps the checkpoint's precision and runs on the dense_linear op. ``--lm-head-quant
int8`` quantizes it at load to int8 with one scale per vocabulary row (absmax / 127, the W8A8
kernel format, whose activations are quantized per token), held in the repack cache.
"""
from __future__ import annotations

import torch

from shrike.errors import ConfigError
from shrike.quantization.repack_cache import RepackCache
from shrike.quantization.safetensors_io import CheckpointFiles

LM_HEAD_QUANT = ("none", "int8")


class LMHead:
    """hidden (L, hidden), normed -> (L, vocab) fp32 logits on the linear op of its weight's format."""

    def __init__(self, weight, vocab_size: int, op_name: str = "dense_linear"):
        # (vocab, hidden) tensor or kernels.DenseTileWeight on dense_linear; with --lm-head-quant int8 a
        # kernels.W8A8Weight (or its reference form) on w8a8_linear
        self.weight = weight
        self.out_features = vocab_size
        self.op_name = op_name
        self.bias = None

    def __call__(self, step, hidden):
        logits = step.empty(step.logits, self.out_features, dtype=torch.float32)
        getattr(step.ops, self.op_name)(hidden, self.weight, None, logits)
        return logits


def quantize_rows_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight (N, K) -> (int8 values (N, K) in [-127, 127], fp32 scale (N,)), symmetric per row."""
    values = torch.empty(weight.shape, dtype=torch.int8)
    scale = torch.empty(weight.shape[0], dtype=torch.float32)
    for start in range(0, weight.shape[0], 4096):  # bounded fp32 temporaries for 100k+ vocabularies
        rows = weight[start:start + 4096].float()
        s = rows.abs().amax(dim=1) / 127.0
        inv = torch.where(s > 0, 1.0 / s, torch.zeros_like(s))
        values[start:start + 4096] = torch.round(rows * inv[:, None]).clamp(-127, 127).to(torch.int8)
        scale[start:start + 4096] = s
    return values, scale


def int8_lm_head(head: LMHead, model_dir, kernel_backend: str) -> LMHead:
    """The int8 form of `head` (its weight (vocab, hidden) or kernels.DenseTileWeight), from the repack cache
    or quantized and stored there (tiles are unpacked only then)."""
    weight = head.weight
    from shrike import kernels
    tiled = isinstance(weight, kernels.DenseTileWeight)
    n, k = (weight.n, weight.k) if tiled else weight.shape
    dtype = torch.bfloat16 if tiled else weight.dtype
    if k % 16:
        raise ConfigError(f"--lm-head-quant int8 needs a hidden size that is a multiple of 16, this model has {k}")
    from shrike.quantization import reference_kernels
    reference = kernel_backend == "reference"
    variant = "reference1" if reference else f"kernels-layout{kernels.LAYOUT_VERSION}-{kernels.active_isa()}"
    cache = RepackCache(CheckpointFiles(model_dir), variant)
    # Its own name in the entry, so it never meets a layer of a quantized checkpoint; the source
    # dtype is part of it because the int8 values depend on the weights as loaded.
    name = f"lm_head@int8-per-row-absmax-from-{str(dtype).removeprefix('torch.')}"
    cached = cache.load(name)
    if cached is None:
        values, scale = quantize_rows_int8(weight.unpack() if tiled else weight)
        built = reference_kernels.ReferenceW8A8Weight(values, scale) if reference \
            else kernels.W8A8Weight.from_int8(values, scale)
        cached = cache.store(name, built.tensors())
    restored = reference_kernels.ReferenceW8A8Weight.from_tensors(cached) if reference \
        else kernels.W8A8Weight.from_tensors(cached)
    if _shape(restored) != (n, k):
        raise ConfigError(f"the repack cache entry {cache.entry} holds an lm_head of another shape; delete it")
    return LMHead(restored, head.out_features, "w8a8_linear")


def _shape(weight) -> tuple[int, int]:
    return tuple(weight.values.shape) if hasattr(weight, "values") else (weight.n, weight.k)
