"""GGUF llama tensors to Hugging Face LlamaForCausalLM tensors (names, layout, bf16)."""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np
import torch
from gguf import GGMLQuantizationType, ReaderTensor
from gguf import quants as gguf_quants
from gguf.quants import dequantize

GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def hf_tensor_name(gguf_name: str, layer_names: dict[str, str] = LAYER_NAMES,
                   model: str = "a plain Llama model") -> str:
    """The Hugging Face name of a GGUF tensor; layer_names maps blk.N.<part> to the model's layer parts."""
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match and match.group(2) in layer_names:
        return f"model.layers.{match.group(1)}.{layer_names[match.group(2)]}.weight"
    if gguf_name == "rope_freqs.weight":
        raise ValueError("this GGUF uses Llama 3.1-style RoPE frequency scaling (rope_freqs), which is not supported")
    raise ValueError(
        f"GGUF tensor {gguf_name!r} has no place in {model}; supported tensors are "
        f"{', '.join(GLOBAL_NAMES)} and blk.N.{{{','.join(layer_names)}}}.weight"
    )


def attention_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """A decoder layer's norms around attention and its q/k/v/o projections (Llama's, Gemma's and the MoE models')."""
    hidden = config["hidden_size"]
    q_rows = config["num_attention_heads"] * config["head_dim"]
    kv_rows = config["num_key_value_heads"] * config["head_dim"]
    return {
        "input_layernorm": (hidden,), "post_attention_layernorm": (hidden,),
        "self_attn.q_proj": (q_rows, hidden), "self_attn.k_proj": (kv_rows, hidden),
        "self_attn.v_proj": (kv_rows, hidden), "self_attn.o_proj": (hidden, q_rows),
    }


def mlp_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    hidden, ffn = config["hidden_size"], config["intermediate_size"]
    return {"mlp.gate_proj": (ffn, hidden), "mlp.up_proj": (ffn, hidden), "mlp.down_proj": (hidden, ffn)}


def undo_rope_permutation(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Reverse llama.cpp's HF->GGUF reordering of q_proj/k_proj rows.

    llama.cpp rotates interleaved pairs (x0,x1),(x2,x3)...; HF's rotate_half pairs x_i with x_{i+head_dim/2}.
    The converter therefore moved row i + j*head_dim/2 of each head to row 2*i + j; this moves it back.
    """
    rows, cols = weight.shape  # [num_heads * head_dim, hidden]
    half_head = rows // num_heads // 2
    interleaved = weight.reshape(num_heads, half_head, 2, cols)
    return interleaved.swapaxes(1, 2).reshape(rows, cols)


def readable_tensor_types() -> list[str]:
    """GGML tensor types the `gguf` package dequantizes (F32, F16 and every type with a dequantizer)."""
    readable = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, *gguf_quants._type_traits}
    return [t.name for t in GGMLQuantizationType if t in readable]


def dequantized(tensor: ReaderTensor) -> np.ndarray:
    try:
        values = dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError:
        raise ValueError(f"GGUF tensor {tensor.name!r} has type {tensor.tensor_type.name}, which Shrike cannot "
                         f"read; supported types: {', '.join(readable_tensor_types())}") from None
    # GGUF lists dimensions innermost first; numpy/torch want outermost first
    return np.array(values, dtype=np.float32).reshape(tuple(int(d) for d in reversed(tensor.shape)))


class TensorConverter:
    """How one architecture's GGUF tensors become its Hugging Face tensors (names, layout, bf16).

    names() maps a GGUF tensor to the Hugging Face tensors it becomes without reading its data (so a model can
    be built from the file itself, each tensor converted when it is asked for: model.weights.GGUFTensors);
    convert() dequantizes and lays them out. Subclasses give the expected shapes and the layout.
    """
    model = "a plain Llama model"  # for messages
    layer_names = LAYER_NAMES  # blk.N.<part> -> the model's layer part

    def __init__(self, config: dict):
        self.config = config
        self.shapes = self.expected_shapes(config)

    def layer_shapes(self, config: dict) -> dict[str, tuple[int, ...]]:
        """Shapes of one decoder layer's tensors, by their name under model.layers.{i}. (without .weight)."""
        return {**attention_shapes(config), **mlp_shapes(config)}

    def expected_shapes(self, config: dict) -> dict[str, tuple[int, ...]]:
        """Every tensor the model needs: the embedding table, the final norm, an untied lm_head, each layer's."""
        hidden = config["hidden_size"]
        shapes = {"model.embed_tokens.weight": (config["vocab_size"], hidden), "model.norm.weight": (hidden,)}
        if not config["tie_word_embeddings"]:
            shapes["lm_head.weight"] = (config["vocab_size"], hidden)
        per_layer = self.layer_shapes(config)
        for layer in range(config["num_hidden_layers"]):
            for module, shape in per_layer.items():
                shapes[f"model.layers.{layer}.{module}.weight"] = shape
        return shapes

    def names(self, tensor: ReaderTensor) -> list[str]:
        """The Hugging Face tensors `tensor` becomes; ValueError when the model has no place for it."""
        name = hf_tensor_name(tensor.name, self.layer_names, self.model)
        if name not in self.shapes:
            raise ValueError(f"GGUF tensor {tensor.name!r} does not fit the model described by the file's metadata")
        return [name]

    def layout(self, tensor: ReaderTensor, weight: np.ndarray) -> dict[str, np.ndarray]:
        """The dequantized weight (outermost dimension first) as the Hugging Face tensors it becomes."""
        (name,) = self.names(tensor)
        kind = tensor.name.split(".")[-2]  # "attn_q" in "blk.0.attn_q.weight"
        heads = {"attn_q": self.config["num_attention_heads"], "attn_k": self.config["num_key_value_heads"]}
        return {name: undo_rope_permutation(weight, heads[kind]) if kind in heads else weight}

    def convert(self, tensor: ReaderTensor) -> dict[str, torch.Tensor]:
        self.names(tensor)  # a tensor the model has no place for fails before it is dequantized
        pieces = self.layout(tensor, dequantized(tensor))
        for name, piece in pieces.items():
            if tuple(piece.shape) != self.shapes[name]:
                raise ValueError(f"GGUF tensor {tensor.name!r} has shape {list(piece.shape)} but the metadata implies "
                                 f"{list(self.shapes[name])}; the file is inconsistent or not {self.model}")
        return {name: torch.from_numpy(np.ascontiguousarray(piece)).to(torch.bfloat16)
                for name, piece in pieces.items()}

    def check_complete(self, names: Iterable[str]) -> None:
        missing = sorted(set(self.shapes) - set(names))
        if missing:
            raise ValueError(f"the GGUF file lacks {len(missing)} tensors {self.model} needs, e.g. {missing[:3]}")

    def convert_all(self, tensors: Iterable[ReaderTensor]) -> dict[str, torch.Tensor]:
        converted: dict[str, torch.Tensor] = {}
        for tensor in tensors:
            converted.update(self.convert(tensor))
        self.check_complete(converted)
        return converted
