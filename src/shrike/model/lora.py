"""LoRA adapters in PEFT's layout (adapter_config.json + adapter_model.safetensors), read and checked against
the model they adapt, and written into the adapter slots of its linear layers (shrike.layers.lora).

PEFT names a projection `base_model.model.<checkpoint prefix>.lora_A.weight` (A: (r, in)) and `...lora_B.weight`
(B: (out, r)); the update of a row x is x A^T B^T * scaling, scaling = lora_alpha / r (lora_alpha / sqrt(r)
with use_rslora).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from shrike.errors import ConfigError
from shrike.layers.lora import LoRASlots

# The projections an adapter may target: the attention and MLP linears of a decoder layer.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_PEFT_PREFIX = "base_model.model."


@dataclass
class LoRAAdapter:
    path: Path
    rank: int
    scaling: float
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]  # checkpoint prefix -> (A (rank, in), B (out, rank))


def read_peft_adapter(path: str | Path) -> LoRAAdapter:
    """The adapter in directory `path`; ConfigError (one line) for anything Shrike cannot apply."""
    path = Path(path).expanduser()
    config_file, weights_file = path / "adapter_config.json", path / "adapter_model.safetensors"
    if not config_file.is_file():
        raise ConfigError(f"{path} is not a PEFT adapter directory: it has no adapter_config.json")
    if not weights_file.is_file():
        raise ConfigError(f"{path} has no adapter_model.safetensors; save the adapter with PEFT's "
                          "save_pretrained(..., safe_serialization=True)")
    config = json.loads(config_file.read_text())
    if config.get("peft_type", "LORA") != "LORA":
        raise ConfigError(f"{path} is a {config.get('peft_type')} adapter; only LoRA adapters are supported")
    for key, unsupported in (("use_dora", "DoRA"), ("rank_pattern", "a per-module rank_pattern"),
                             ("alpha_pattern", "a per-module alpha_pattern"), ("modules_to_save", "modules_to_save")):
        if config.get(key):
            raise ConfigError(f"{path} uses {unsupported}, which Shrike's LoRA does not support")
    if config.get("bias", "none") != "none":
        raise ConfigError(f"{path} trains biases (bias={config['bias']!r}); Shrike's LoRA supports bias='none'")
    rank, alpha = int(config["r"]), float(config.get("lora_alpha", config["r"]))
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    tensors = load_file(str(weights_file))
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name in tensors:
        if not name.startswith(_PEFT_PREFIX) or not name.endswith((".lora_A.weight", ".lora_B.weight")):
            raise ConfigError(f"{path}: tensor {name!r} is not a LoRA A or B matrix of a linear layer")
        prefix = name[len(_PEFT_PREFIX):].rsplit(".", 2)[0]
        if prefix.rsplit(".", 1)[-1] not in TARGET_MODULES:
            raise ConfigError(f"{path} adapts {prefix}; Shrike applies LoRA to {', '.join(TARGET_MODULES)} only")
        a, b = tensors.get(f"{_PEFT_PREFIX}{prefix}.lora_A.weight"), tensors.get(f"{_PEFT_PREFIX}{prefix}.lora_B.weight")
        if a is None or b is None:
            raise ConfigError(f"{path}: {prefix} has only one of its lora_A and lora_B matrices")
        if a.shape[0] != rank or b.shape[1] != rank:
            raise ConfigError(f"{path}: {prefix}'s matrices are not of rank r={rank} as adapter_config.json says")
        weights[prefix] = (a, b)
    if not weights:
        raise ConfigError(f"{path} holds no LoRA matrices")
    return LoRAAdapter(path, rank, scaling, weights)


def attach_lora_slots(model, max_loras: int, max_rank: int) -> list:
    """Give every target linear of the model's decoder layers `max_loras` adapter slots of rank up to
    `max_rank` -> those layers (each knows its checkpoint projections, `checkpoint_parts`)."""
    layers = []
    for decoder_layer in getattr(model, "layers", []):
        for linear in vars(decoder_layer).values():
            parts = getattr(linear, "checkpoint_parts", ())
            if parts and all(prefix.rsplit(".", 1)[-1] in TARGET_MODULES for prefix, _ in parts):
                linear.lora = LoRASlots(max_loras, max_rank, linear.in_features, [n for _, n in parts])
                layers.append(linear)
    if not layers:
        raise ConfigError(f"--enable-lora: the {type(model).__name__} architecture has no linear layer LoRA adapters "
                          "can target")
    return layers


def check_adapter(adapter: LoRAAdapter, layers: list, max_rank: int) -> None:
    """ConfigError unless every matrix of the adapter fits a projection of the model and its rank fits the slots."""
    if adapter.rank > max_rank:
        raise ConfigError(f"{adapter.path} has rank {adapter.rank}, above --max-lora-rank {max_rank}; "
                          f"start the server with --max-lora-rank {adapter.rank} or more")
    shapes = {prefix: (n, layer.in_features) for layer in layers for prefix, n in layer.checkpoint_parts}
    for prefix, (a, b) in adapter.weights.items():
        if prefix not in shapes:
            raise ConfigError(f"{adapter.path} adapts {prefix}, which this model does not have; was it trained for "
                              "another base model?")
        out_features, in_features = shapes[prefix]
        if a.shape[1] != in_features or b.shape[0] != out_features:
            raise ConfigError(f"{adapter.path}: {prefix} is ({out_features}, {in_features}) in this model but the "
                              f"adapter's matrices are for ({b.shape[0]}, {a.shape[1]}); was it trained for another "
                              "base model?")


def write_adapter(layers: list, slot: int, adapter: LoRAAdapter) -> None:
    """Slot `slot` of every adapted layer takes `adapter` (checked); the layers it leaves alone add nothing there."""
    for layer in layers:
        parts = [adapter.weights.get(prefix) for prefix, _ in layer.checkpoint_parts]
        if any(p is not None for p in parts):
            layer.lora.write(slot, adapter.rank, parts, adapter.scaling)
        else:
            layer.lora.clear(slot)
