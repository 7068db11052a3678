"""Per-input-channel scaling before rounding: SmoothQuant (activation smoothing) and AWQ.

For each input channel j of a linear layer a factor s_j multiplies the weight column W[:, j] and divides
the activation x_j, leaving W x unchanged; the division is folded into whatever produces the activations,
so the checkpoint computes the same function (up to rounding) in the same format:
  q/k/v       <- the norm before attention (input_layernorm)
  gate/up     <- the norm before the MLP (Llama: post_attention_layernorm; Gemma 3: pre_feedforward_layernorm)
  o_proj      <- v_proj rows (one factor per KV head channel, shared by the query heads using it)
  down_proj   <- up_proj rows
A Gemma 3 norm multiplies by (1 + weight): its weight becomes (1 + weight) / s - 1, stored in float32
because for large s that is close to -1 and bf16 would lose most of (1 + weight) / s.

The factors: SmoothQuant (Xiao et al. 2022) moves activation outliers into the weights so that per-token
int8 activations keep precision, s_j = max|x_j|^a / max|W_:,j|^(1-a); AWQ (Lin et al. 2023) protects the
weight columns of large activations from rounding, s_j = mean|x_j|^a. Both are searched (search_factors):
per fold site, every a on a grid is tried and the one whose quantized layers (weights rounded, activations
quantized as the kernels do) reproduce the unquantized outputs on the calibration inputs best is kept;
a = 0 (no scaling) is among the candidates. Layers with attention biases are not scaled: the v_proj bias
would need the same division.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from shrike.model.config import ModelConfig
from shrike.quantization.calibration import InputStatistics
from shrike.quantization.quantizer import dequantize, quantize_weight
from shrike.quantization.reference_kernels import quantize_asym, quantize_sym
from shrike.quantization.safetensors_io import CheckpointFiles
from shrike.quantization.schemes import QuantScheme

# Architecture -> (norm before the MLP, offset its weight is added to).
SCALABLE_ARCHITECTURES = {"LlamaForCausalLM": ("post_attention_layernorm", 0.0),
                          "MiniCPMForCausalLM": ("post_attention_layernorm", 0.0),
                          "Qwen3ForCausalLM": ("post_attention_layernorm", 0.0),
                          "Gemma3ForCausalLM": ("pre_feedforward_layernorm", 1.0)}
FACTOR_FAMILIES = ("smoothquant", "awq")
ALPHAS = tuple(i / 10 for i in range(11))  # the exponent grid both families are searched over


@dataclass(frozen=True)
class FoldSite:
    """Linears reading one input, and the tensor that produces it."""
    owner: str  # the prefix calibration recorded the input under (shrike.quantization.calibration)
    consumers: tuple[str, ...]  # weight names whose columns are multiplied by s
    producer: str  # norm weight or linear weight whose rows are divided by s
    norm_offset: float | None  # the producer norm multiplies by (offset + weight); None: a linear's rows
    heads: tuple[int, int, int] | None = None  # (KV heads, query heads per KV head, head dim) for o_proj

    def expand(self, s: torch.Tensor) -> torch.Tensor:
        """(producer channels,) -> (consumer input channels,): o_proj's query heads share their KV head's factor."""
        if self.heads is None:
            return s
        kv, group, dim = self.heads
        return s.reshape(kv, 1, dim).expand(-1, group, -1).reshape(-1)

    def reduce(self, per_input: torch.Tensor, how: Callable) -> torch.Tensor:
        """(consumer input channels,) statistic -> (producer channels,), combining a KV head's query heads."""
        if self.heads is None:
            return per_input
        kv, group, dim = self.heads
        return how(per_input.reshape(kv, group, dim), 1).reshape(-1)


def can_scale(config: ModelConfig) -> bool:
    return config.architecture in SCALABLE_ARCHITECTURES and not config.attention_bias


def fold_sites(config: ModelConfig) -> list[FoldSite]:
    c = config
    mlp_norm, offset = SCALABLE_ARCHITECTURES[c.architecture]
    heads = (c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim)
    sites = []
    for i in range(c.num_layers):
        p = f"model.layers.{i}"
        attn, mlp = f"{p}.self_attn", f"{p}.mlp"
        sites += [
            FoldSite(f"{attn}.q_proj", tuple(f"{attn}.{n}.weight" for n in ("q_proj", "k_proj", "v_proj")),
                     f"{p}.input_layernorm.weight", offset),
            FoldSite(f"{attn}.o_proj", (f"{attn}.o_proj.weight",), f"{attn}.v_proj.weight", None, heads),
            FoldSite(f"{mlp}.gate_proj", (f"{mlp}.gate_proj.weight", f"{mlp}.up_proj.weight"),
                     f"{p}.{mlp_norm}.weight", offset),
            FoldSite(f"{mlp}.down_proj", (f"{mlp}.down_proj.weight",), f"{mlp}.up_proj.weight", None),
        ]
    return sites


def candidate_factors(site: FoldSite, family: str, alpha: float, seen: InputStatistics,
                      weight_absmax: torch.Tensor) -> torch.Tensor:
    """(producer channels,) factors of one family at exponent alpha; weight_absmax (K,) max |W_:,j|."""
    if family == "smoothquant":
        act = site.reduce(seen.absmax, torch.amax).clamp(min=1e-5)
        s = act.pow(alpha) / site.reduce(weight_absmax, torch.amax).clamp(min=1e-5).pow(1 - alpha)
    else:
        act = site.reduce(seen.mean_abs, torch.mean).clamp(min=1e-5)
        s = act.pow(alpha)
        s = s / (s.amax() * s.amin()).sqrt()  # centred on 1, as AWQ does: the product W x is what matters
    return torch.where(act > 1e-5, s, torch.ones_like(s)).clamp(1e-3, 1e3)


def _activations_as_kernels_see(x: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """x (M, K) as the kernels quantize it: W8A8 symmetric per token, W4A8 asymmetric per token, A16 as is."""
    if scheme.weight_only:
        return x
    if scheme.weight_bits == 8:
        q, scale = quantize_sym(x)
        return q.float() * scale[:, None]
    q, scale, zero = quantize_asym(x)
    return (q.float() - zero[:, None].float()) * scale[:, None]


def search_factors(files: CheckpointFiles, config: ModelConfig, stats: dict[str, InputStatistics],
                   scheme: QuantScheme, family: str) -> dict[str, tuple[torch.Tensor | None, torch.Tensor | None]]:
    """Per fold site the factors of `family` whose quantized layers best reproduce the unquantized outputs on the
    calibration inputs (squared error summed over the site's linears), as tensor transforms (see transforms)."""
    chosen = {}
    for site in fold_sites(config):
        x = stats[site.owner].samples()  # (rows, K)
        weights = [files.read(n).float() for n in site.consumers]  # (N_i, K) each
        weight = torch.cat(weights)  # (N, K)
        exact = x @ weight.T  # (rows, N)
        best = None
        for alpha in ALPHAS:
            s = candidate_factors(site, family, alpha, stats[site.owner], weight.abs().amax(dim=0))
            if alpha == 0:
                s = torch.ones_like(s)
            columns = site.expand(s)
            scaled = torch.cat([dequantize(*quantize_weight(w * columns[None, :], scheme, torch.bfloat16),
                                           scheme.group_size) for w in weights])
            error = (_activations_as_kernels_see(x / columns[None, :], scheme) @ scaled.T - exact).square().sum()
            if best is None or error < best[0]:
                best = (error, s)
        chosen[site] = best[1]
    return transforms(chosen)


def transforms(factors: dict[FoldSite, torch.Tensor]) -> dict[str, tuple[torch.Tensor | None, torch.Tensor | None]]:
    """tensor name -> (column factors, row divisors), either None: W' = W * col[None, :] / row[:, None].
    Norm weights are 1-D: their entry is (None, divisors), applied with the site's norm offset."""
    out: dict[str, list] = {}

    def add(name: str, columns: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> None:
        cols, divs = out.setdefault(name, [None, None])
        out[name] = [columns if cols is None else cols * columns if columns is not None else cols,
                     rows if divs is None else divs * rows if rows is not None else divs]

    for site, s in factors.items():
        add(site.producer, rows=s)
        for name in site.consumers:
            add(name, columns=site.expand(s))
    return {name: (cols, rows) for name, (cols, rows) in out.items()}


def norm_offsets(config: ModelConfig) -> dict[str, float]:
    """Norm weight name -> the offset its weight is added to, for the norms fold sites divide."""
    return {site.producer: site.norm_offset for site in fold_sites(config) if site.norm_offset is not None}


def apply_transform(tensor: torch.Tensor, transform: tuple[torch.Tensor | None, torch.Tensor | None],
                    norm_offset: float = 0.0) -> torch.Tensor:
    """The scaled tensor, in tensor's dtype; a norm with an offset in float32 (see the module doc)."""
    columns, rows = transform
    out = tensor.float()
    if out.dim() == 1:
        return ((out + norm_offset) / rows - norm_offset).to(torch.float32 if norm_offset else tensor.dtype)
    if columns is not None:
        out = out * columns[None, :]
    if rows is not None:
        out = out / rows[:, None]
    return out.to(tensor.dtype)
