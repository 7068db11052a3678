"""Rotary position embeddings, with linear, llama3 and longrope frequency scaling."""
from __future__ import annotations

import math

import torch

from shrike.model.config import ModelConfig


def _default_inv_freq(theta: float, head_dim: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))  # (head_dim/2,)


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = scaling["factor"]
    low_freq_factor = scaling.get("low_freq_factor", 1.0)
    high_freq_factor = scaling.get("high_freq_factor", 4.0)
    old_context = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding:
    """Precomputed cos/sin tables for every position up to max_positions.

    LongRoPE keeps two tables: a sequence whose length exceeds the original context uses
    the long-factor table for its new tokens, as the Hugging Face implementations do.
    """

    def __init__(self, config: ModelConfig, max_positions: int):
        self.head_dim = config.head_dim
        inv_freq = _default_inv_freq(config.rope_theta, config.head_dim)
        scaling = config.rope_scaling or {}
        kind = scaling.get("rope_type", scaling.get("type"))
        self.long_threshold: int | None = None
        if kind == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, scaling)
        elif kind == "linear":  # positions divided by the factor
            inv_freq = inv_freq / float(scaling["factor"])
        positions = torch.arange(max_positions, dtype=torch.float32)
        if kind == "longrope":
            original = scaling.get("original_max_position_embeddings") or config.raw.get(
                "original_max_position_embeddings", config.max_position_embeddings)
            factor = config.max_position_embeddings / original
            attn_factor = scaling.get("attention_factor")
            if attn_factor is None:
                attn_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
            short = torch.tensor(scaling["short_factor"], dtype=torch.float32)
            long = torch.tensor(scaling["long_factor"], dtype=torch.float32)
            self.cos_sin = self._table(positions, inv_freq / short, attn_factor)
            self.cos_sin_long = self._table(positions, inv_freq / long, attn_factor)
            self.long_threshold = original
        else:
            self.cos_sin = self._table(positions, inv_freq, 1.0)

    @staticmethod
    def _table(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float) -> torch.Tensor:
        freqs = torch.outer(positions, inv_freq)  # (max_positions, head_dim/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (max_positions, head_dim)
        return torch.stack((emb.cos() * scale, emb.sin() * scale))  # (2, max_positions, head_dim)

    def cos_sin_for(self, positions: torch.Tensor, use_long: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: (T,) int64; use_long: (T,) bool or None -> cos, sin (T, head_dim) fp32."""
        table = self.cos_sin[:, positions]
        if self.long_threshold is not None and use_long is not None and bool(use_long.any()):
            table = torch.where(use_long[None, :, None], self.cos_sin_long[:, positions], table)
        return table[0], table[1]
