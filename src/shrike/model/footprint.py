"""What a checkpoint holds and what one decoded token reads: total and active parameters, stored bytes and bytes
per token. A mixture-of-experts token reads only its num_experts_per_tok experts of each MoE layer; every token
reads all other weights except the embedding table (one row)."""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Footprint:
    total_params: int
    active_params: int  # per token (the embedding and lm_head included, as model cards count them)
    weight_bytes: int  # as stored in the checkpoint's safetensors files, or in the GGUF file run natively
    bytes_per_token: int  # read by one decoded token (batch 1)

    def describe(self) -> str:
        read = (f"a decoded token reads {self.bytes_per_token / 1e9:.2f} GB of the {self.weight_bytes / 1e9:.2f} GB "
                "of weights")
        if self.active_params == self.total_params:
            return f"parameters {self.total_params / 1e9:.2f} B; {read}"
        return f"parameters {self.active_params / 1e9:.2f} B active of {self.total_params / 1e9:.2f} B; {read}"


def _layer_params(config: dict, sparse: bool) -> tuple[int, int]:
    """(total, active) parameters of one decoder layer."""
    h, heads = config["hidden_size"], config["num_attention_heads"]
    d = config.get("head_dim") or h // heads
    kv = config.get("num_key_value_heads") or heads
    attention = h * (heads + 2 * kv) * d + heads * d * h + 2 * h
    if str(config.get("model_type", "")).startswith("qwen3"):
        attention += 2 * d  # RMSNorm weights of the q and k heads
    if not sparse:
        return attention + 3 * h * config["intermediate_size"], attention + 3 * h * config["intermediate_size"]
    experts = config.get("num_experts") or config["num_local_experts"]
    inter = config.get("moe_intermediate_size") or config["intermediate_size"]
    one = 3 * h * inter
    router = experts * h
    return attention + router + experts * one, attention + router + config["num_experts_per_tok"] * one


def _sparse_layers(config: dict) -> list[bool]:
    layers = config["num_hidden_layers"]
    if not (config.get("num_experts") or config.get("num_local_experts")):
        return [False] * layers
    step, dense = int(config.get("decoder_sparse_step", 1)), set(config.get("mlp_only_layers") or [])
    return [i not in dense and (i + 1) % step == 0 for i in range(layers)]


def checkpoint_tensor_bytes(source: Path) -> dict[str, int]:
    """Tensor name -> stored bytes, from the safetensors headers of a checkpoint directory, or from a GGUF file's
    tensor list under their Hugging Face names (nothing is read but the headers). A loaded model has them
    already (LoadedModel.footprint)."""
    if source.suffix.lower() == ".gguf" and source.is_file():
        from shrike.convert.gguf import read_gguf_model  # they import torch, which `shrike doctor` otherwise does not
        from shrike.model.weights import GGUFTensors
        return GGUFTensors(read_gguf_model(source)).stored_bytes()
    model_dir, sizes = source, {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with open(path, "rb") as f:
            try:
                header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
            except (struct.error, ValueError):
                raise ValueError(f"{path} has no safetensors header") from None
        for name, entry in header.items():
            if name != "__metadata__":
                begin, end = entry["data_offsets"]
                sizes[name] = end - begin
    return sizes


def footprint(config: dict, sizes: dict[str, int]) -> Footprint:
    """config: the checkpoint's config.json as a dict; sizes: its tensors' stored bytes (checkpoint_tensor_bytes).
    Raises KeyError for a config without the fields counted."""
    sparse = _sparse_layers(config)
    layers = [_layer_params(config, s) for s in sparse]
    embedding = config["vocab_size"] * config["hidden_size"]
    head = 0 if config.get("tie_word_embeddings") else embedding
    total = sum(t for t, _ in layers) + embedding + head + config["hidden_size"]
    active = sum(a for _, a in layers) + embedding + head + config["hidden_size"]
    stored = sum(sizes.values())
    skipped = sum(b for n, b in sizes.items() if "embed_tokens" in n)
    if config.get("tie_word_embeddings"):
        skipped = 0  # the tied table is the lm_head: read whole
    experts = config.get("num_experts") or config.get("num_local_experts")
    if experts:
        expert_bytes = sum(b for n, b in sizes.items() if ".experts." in n)
        skipped += expert_bytes - expert_bytes * config["num_experts_per_tok"] // experts
    return Footprint(total, active, stored, stored - skipped)
