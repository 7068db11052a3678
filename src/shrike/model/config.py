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
        if c.num_heads % c.num_kv_heads:
            raise ConfigError(f"num_attention_heads {c.num_heads} is not a multiple of num_key_value_heads {c.num_kv_heads}")
        if c.rope_scaling is not None:
            kind = c.rope_scaling.get("rope_type", c.rope_scaling.get("type"))
            if kind not in ("default", "llama3", "longrope", None):
                raise ConfigError(f"rope_scaling type {kind!r} is not supported; supported: llama3, longrope")
        return c
