"""Model hyper-parameters read from a Hugging Face `config.json`."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from shrike.errors import ConfigError

def _scaling_only(rope_parameters: dict) -> dict | None:
    if rope_parameters.get("rope_type", "default") == "default":
        return None
    return {k: v for k, v in rope_parameters.items() if k != "rope_theta"}


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    attention_bias: bool = False  # bias on q/k/v (Qwen2 always, Llama when configured)
    o_proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    # MiniCPM scalings; neutral values reduce the model exactly to Llama.
    scale_emb: float = 1.0
    residual_scale: float = 1.0  # scale_depth / sqrt(num_layers)
    logit_divisor: float = 1.0  # hidden_size / dim_model_base
    # Gemma 3 (shrike.model.gemma3); defaults reduce each to off.
    layer_types: list[str] | None = None  # per layer "sliding_attention" or "full_attention"
    sliding_window: int = 0  # positions a sliding layer's query sees (itself included)
    rope_local_theta: float | None = None  # RoPE base of the sliding layers
    query_scale: float | None = None  # attention scale; None: head_dim ** -0.5
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)
    quantization_config: dict | None = None
    raw: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_dir(cls, model_dir: Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ConfigError(f"{model_dir} has no config.json: point at a Hugging Face-style model directory or a .gguf file")
        with open(path) as f:
            return cls.from_dict(json.load(f))

    @classmethod
    def from_dict(cls, cfg: dict) -> "ModelConfig":
        # Whether the architecture is supported is the registry's call (plugins may add some).
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else "(none)"
        # transformers >= 5 writes rope_theta and the scaling together as rope_parameters.
        rope_parameters = cfg.get("rope_parameters") or {}
        try:
            hidden = cfg["hidden_size"]
            heads = cfg["num_attention_heads"]
            layers = cfg["num_hidden_layers"]
            c = cls(
                architecture=arch,
                vocab_size=cfg["vocab_size"],
                hidden_size=hidden,
                intermediate_size=cfg["intermediate_size"],
                num_layers=layers,
                num_heads=heads,
                num_kv_heads=cfg.get("num_key_value_heads") or heads,
                head_dim=cfg.get("head_dim") or hidden // heads,
                rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
                max_position_embeddings=cfg.get("max_position_embeddings", 2048),
                tie_word_embeddings=cfg.get("tie_word_embeddings", arch == "MiniCPMForCausalLM"),
                rope_theta=float(cfg.get("rope_theta") or rope_parameters.get("rope_theta", 10000.0)),
                rope_scaling=cfg.get("rope_scaling") or _scaling_only(rope_parameters),
                attention_bias=bool(cfg.get("attention_bias", False)) or arch == "Qwen2ForCausalLM",
                o_proj_bias=bool(cfg.get("attention_bias", False)) and arch == "LlamaForCausalLM",
                mlp_bias=bool(cfg.get("mlp_bias", False)),
                qk_norm=arch == "Qwen3ForCausalLM",
                quantization_config=cfg.get("quantization_config"),
                raw=cfg,
            )
        except KeyError as e:
            raise ConfigError(f"config.json lacks the field {e.args[0]!r} that {arch} needs") from None
        if arch == "MiniCPMForCausalLM":
            c.scale_emb = float(cfg.get("scale_emb", 1.0))
            c.residual_scale = float(cfg.get("scale_depth", 1.0)) / math.sqrt(layers)
            c.logit_divisor = hidden / float(cfg.get("dim_model_base", hidden))
        if arch == "Gemma3ForCausalLM":
            _gemma3_fields(c, cfg, rope_parameters)
        if c.num_heads % c.num_kv_heads:
            raise ConfigError(f"num_attention_heads {c.num_heads} is not a multiple of num_key_value_heads {c.num_kv_heads}")
        if c.rope_scaling is not None:
            kind = c.rope_scaling.get("rope_type", c.rope_scaling.get("type"))
            if kind not in ("default", "llama3", "longrope", "linear", None):
                raise ConfigError(f"rope_scaling type {kind!r} is not supported; supported: linear, llama3, longrope")
        return c


def _gemma3_fields(c: ModelConfig, cfg: dict, rope_parameters: dict) -> None:
    """Gemma 3's sliding/global layer pattern, two RoPE bases, query scale and soft-capping.

    transformers >= 5 writes the RoPE settings per layer type under rope_parameters; older configs
    have rope_theta, rope_local_base_freq and rope_scaling, and sliding_window_pattern instead of layer_types."""
    if cfg.get("attn_logit_softcapping") is not None:
        raise ConfigError("attention logit soft-capping (attn_logit_softcapping) is not supported; "
                          "Gemma 3 checkpoints leave it null")
    layer_types = cfg.get("layer_types")
    if layer_types is None:
        pattern = int(cfg.get("sliding_window_pattern", 6))
        layer_types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(c.num_layers)]
    if len(layer_types) != c.num_layers or set(layer_types) - {"sliding_attention", "full_attention"}:
        raise ConfigError("config.json layer_types must list 'sliding_attention' or 'full_attention' for every layer")
    c.layer_types = list(layer_types)
    c.sliding_window = int(cfg.get("sliding_window") or 0)
    if "sliding_attention" in layer_types and c.sliding_window < 1:
        raise ConfigError("config.json has sliding_attention layers but no positive sliding_window")
    if "full_attention" in rope_parameters:  # per-layer-type form
        full, local = rope_parameters["full_attention"], rope_parameters.get("sliding_attention", {})
        c.rope_theta = float(full.get("rope_theta", c.rope_theta))
        c.rope_scaling = None if full.get("rope_type", "default") == "default" else \
            {k: v for k, v in full.items() if k != "rope_theta"}
        c.rope_local_theta = float(local.get("rope_theta", 10000.0))
        if local.get("rope_type", "default") != "default":
            raise ConfigError("RoPE scaling on the sliding-window layers is not supported")
    else:
        c.rope_local_theta = float(cfg.get("rope_local_base_freq", 10000.0))
    c.query_scale = float(cfg.get("query_pre_attn_scalar") or c.head_dim) ** -0.5
    c.final_logit_softcapping = cfg.get("final_logit_softcapping")
    c.tie_word_embeddings = bool(cfg.get("tie_word_embeddings", True))
    activation = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if activation not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ConfigError(f"Gemma 3 activation {activation!r} is not supported; supported: gelu_pytorch_tanh")
