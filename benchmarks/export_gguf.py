"""Export a bf16 Hugging Face-style checkpoint (config.json, *.safetensors, tokenizer.json) to GGUF.

The benchmark compares Shrike and llama.cpp on the same weights: this writes them as an F16 or BF16
GGUF that llama.cpp loads directly, or that its own `llama-quantize` turns into Q4_0/Q8_0.

    python benchmarks/export_gguf.py MODEL_DIR OUT.gguf [--dtype bf16|f16]

Llama checkpoints become the `llama` architecture; MiniCPM ones the `minicpm` architecture, which is
llama's graph plus MiniCPM's embedding, residual and logit scalings. Q and K projections are
permuted back into the rotary layout llama.cpp expects (the inverse of what Hugging Face's
conversion did). The tokenizer must be a byte-level BPE tokenizer.json (GPT-2 family).
"""

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors import safe_open

GGUF_ARCH_OF_MODEL_TYPE = {"llama": "llama", "minicpm": "minicpm"}

FILE_TYPES = {
    "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
}

GLOBAL_TENSOR_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}

LAYER_TENSOR_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}

LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# Buffers some checkpoints carry that llama.cpp recomputes itself.
IGNORED_TENSOR_SUFFIXES = (".rotary_emb.inv_freq",)


class ExportError(ValueError):
    """The checkpoint cannot be written as a GGUF that llama.cpp would run the same way."""


@dataclass(frozen=True)
class TensorPlan:
    source_name: str
    gguf_name: str
    shape: tuple[int, ...]
    rotary_heads: int | None  # Q/K projections: the head count to permute by; None for all other tensors


def gguf_tensor_name(hf_name: str) -> str | None:
    """The GGUF name of a Hugging Face tensor name, or None for tensors llama.cpp does not load."""
    if hf_name.endswith(IGNORED_TENSOR_SUFFIXES):
        return None
    if hf_name in GLOBAL_TENSOR_NAMES:
        return GLOBAL_TENSOR_NAMES[hf_name]
    match = LAYER_NAME.match(hf_name)
    if match and match.group(2) in LAYER_TENSOR_NAMES:
        return f"blk.{match.group(1)}.{LAYER_TENSOR_NAMES[match.group(2)]}"
    raise ExportError(f"tensor {hf_name!r} has no llama.cpp equivalent in the llama architecture")


def permute_for_rotary(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Hugging Face rotates the two halves of each head; llama.cpp rotates interleaved pairs."""
    rows = weight.shape[0]
    return (weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape))


def safetensors_shapes(model_dir: Path) -> dict[str, tuple[Path, tuple[int, ...], str]]:
    """Every tensor of the checkpoint: the file holding it, its shape and its dtype name."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ExportError(f"{model_dir} has no .safetensors files")
    found = {}
    for file in files:
        with safe_open(file, framework="pt") as handle:
            for name in handle.keys():
                sliced = handle.get_slice(name)
                found[name] = (file, tuple(sliced.get_shape()), sliced.get_dtype())
    return found


def plan_tensors(config: dict, tensors: dict[str, tuple[Path, tuple[int, ...], str]]) -> list[TensorPlan]:
    quantized = sorted(name for name, (_, _, dtype) in tensors.items() if dtype not in ("BF16", "F16", "F32"))
    if quantized:
        raise ExportError(f"only unquantized checkpoints export; {quantized[0]} is {tensors[quantized[0]][2]}")
    rotary_heads = {"attn_q.weight": config["num_attention_heads"],
                    "attn_k.weight": config.get("num_key_value_heads", config["num_attention_heads"])}
    tied = config.get("tie_word_embeddings", False)
    plans = []
    for name, (_, shape, _) in tensors.items():
        target = gguf_tensor_name(name)
        if target is None or (tied and target == "output.weight"):
            continue
        plans.append(TensorPlan(name, target, shape, rotary_heads.get(target.split(".", 2)[-1])))
    return sorted(plans, key=lambda plan: _gguf_order(plan.gguf_name))


def _gguf_order(name: str) -> tuple[int, str]:
    """Global tensors first, then blocks in numeric order, as llama.cpp's converter writes them."""
    match = re.match(r"blk\.(\d+)\.", name)
    return (int(match.group(1)) + 1 if match else 0, name)


def storage_type(plan: TensorPlan, weight_type: gguf.GGMLQuantizationType) -> gguf.GGMLQuantizationType:
    # llama.cpp keeps norms (all 1-D tensors) in F32, as its own converter does
    return gguf.GGMLQuantizationType.F32 if len(plan.shape) == 1 else weight_type


def tensor_bytes(tensor: torch.Tensor, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    if qtype == gguf.GGMLQuantizationType.F32:
        return tensor.to(torch.float32).numpy()
    if qtype == gguf.GGMLQuantizationType.F16:
        return tensor.to(torch.float16).numpy()
    # BF16 has no numpy dtype: its bit patterns travel as uint16, unchanged
    return tensor.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def numpy_dtype(qtype: gguf.GGMLQuantizationType) -> np.dtype:
    return np.dtype({gguf.GGMLQuantizationType.F32: np.float32,
                     gguf.GGMLQuantizationType.F16: np.float16,
                     gguf.GGMLQuantizationType.BF16: np.uint16}[qtype])


def write_model_metadata(writer: gguf.GGUFWriter, config: dict, file_type: gguf.LlamaFileType, name: str) -> None:
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer.add_name(name)
    writer.add_file_type(file_type)
    writer.add_context_length(config.get("max_position_embeddings", 2048))
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.get("num_key_value_heads", heads))
    writer.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(config["vocab_size"])
    _write_rope_scaling(writer, config.get("rope_scaling"))
    if config.get("model_type") == "minicpm":
        layers = config["num_hidden_layers"]
        writer.add_embedding_scale(float(config.get("scale_emb", 1.0)))
        writer.add_residual_scale(float(config.get("scale_depth", 1.0)) / math.sqrt(layers))
        writer.add_logit_scale(config["hidden_size"] / float(config.get("dim_model_base", config["hidden_size"])))


def _write_rope_scaling(writer: gguf.GGUFWriter, rope_scaling: dict | None) -> None:
    if not rope_scaling:
        return
    kind = rope_scaling.get("rope_type") or rope_scaling.get("type")
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope_scaling["factor"]))
        return
    # Positions beyond the original context would differ; the benchmark's short contexts do not reach them.
    print(f"export_gguf: warning: rope scaling {kind!r} is not exported; llama.cpp uses plain RoPE",
          file=sys.stderr)


def _pre_tokenizer_name(tokenizer: dict) -> str:
    """llama.cpp's name for the split rules in front of the BPE merges (it cannot read them from the file)."""
    pre = tokenizer.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [part.get("type") for part in parts]
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits"):
        return "smollm"  # StarCoder-style: digits alone, then GPT-2's rules
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    raise ExportError(f"pre-tokenizer {kinds} has no known llama.cpp name; pass --tokenizer-pre")


def write_tokenizer_metadata(writer: gguf.GGUFWriter, model_dir: Path, vocab_rows: int, pre_name: str | None) -> None:
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    model = tokenizer["model"]
    if model.get("type") != "BPE" or (tokenizer.get("decoder") or {}).get("type") != "ByteLevel":
        raise ExportError("only byte-level BPE tokenizers (GPT-2 family) export to GGUF here")
    tokens, token_types = _token_table(tokenizer, vocab_rows)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_name or _pre_tokenizer_name(tokenizer))
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges([merge if isinstance(merge, str) else " ".join(merge) for merge in model["merges"]])
    _write_special_tokens(writer, model_dir)


def _token_table(tokenizer: dict, vocab_rows: int) -> tuple[list[str], list[int]]:
    """Token strings and types by id, padded with unused tokens up to the embedding's row count."""
    by_id = {token_id: (text, gguf.TokenType.NORMAL) for text, token_id in tokenizer["model"]["vocab"].items()}
    for added in tokenizer.get("added_tokens", []):
        kind = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
        by_id[added["id"]] = (added["content"], kind)
    if max(by_id) >= vocab_rows:
        raise ExportError(f"the tokenizer has token id {max(by_id)} but the embedding only {vocab_rows} rows")
    tokens, types = [], []
    for token_id in range(vocab_rows):
        text, kind = by_id.get(token_id, (f"[PAD{token_id}]", gguf.TokenType.UNUSED))
        tokens.append(text)
        types.append(int(kind))
    return tokens, types


def _write_special_tokens(writer: gguf.GGUFWriter, model_dir: Path) -> None:
    config = _read_json(model_dir / "config.json")
    generation = _read_json(model_dir / "generation_config.json")
    tokenizer_config = _read_json(model_dir / "tokenizer_config.json")
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id),
                     ("pad_token_id", writer.add_pad_token_id)):
        value = generation.get(key, config.get(key))
        if isinstance(value, list):
            value = value[0]
        if value is not None:
            add(int(value))
    writer.add_add_bos_token(bool(tokenizer_config.get("add_bos_token", False)))
    writer.add_add_eos_token(bool(tokenizer_config.get("add_eos_token", False)))
    if tokenizer_config.get("chat_template"):
        writer.add_chat_template(tokenizer_config["chat_template"])


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def export(model_dir: Path, out_path: Path, dtype: str = "bf16", tokenizer_pre: str | None = None) -> Path:
    config = json.loads((model_dir / "config.json").read_text())
    arch = GGUF_ARCH_OF_MODEL_TYPE.get(config.get("model_type"))
    if arch is None:
        raise ExportError(f"model_type {config.get('model_type')!r} is not exported; "
                          f"supported: {', '.join(GGUF_ARCH_OF_MODEL_TYPE)}")
    weight_type, file_type = FILE_TYPES[dtype]
    tensors = safetensors_shapes(model_dir)
    plans = plan_tensors(config, tensors)

    writer = gguf.GGUFWriter(str(out_path), arch)
    write_model_metadata(writer, config, file_type, model_dir.name)
    write_tokenizer_metadata(writer, model_dir, config["vocab_size"], tokenizer_pre)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for plan in plans:
        qtype = storage_type(plan, weight_type)
        element_dtype = numpy_dtype(qtype)
        writer.add_tensor_info(plan.gguf_name, plan.shape, element_dtype,
                               math.prod(plan.shape) * element_dtype.itemsize, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    # One tensor in memory at a time, so multi-GB checkpoints export in little memory
    for plan in plans:
        with safe_open(tensors[plan.source_name][0], framework="pt") as handle:
            weight = handle.get_tensor(plan.source_name)
        if plan.rotary_heads:
            weight = permute_for_rotary(weight, plan.rotary_heads)
        writer.write_tensor_data(tensor_bytes(weight, storage_type(plan, weight_type)))
    writer.close()
    return out_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="export_gguf", description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path, help="directory with config.json, *.safetensors, tokenizer.json")
    parser.add_argument("out", type=Path, help="GGUF file to write")
    parser.add_argument("--dtype", choices=sorted(FILE_TYPES), default="bf16",
                        help="storage type of the matrices (norms stay F32); default bf16, the exact weights")
    parser.add_argument("--tokenizer-pre", default=None,
                        help="llama.cpp pre-tokenizer name (default: recognised from tokenizer.json)")
    args = parser.parse_args(argv)
    try:
        export(args.model_dir, args.out, args.dtype, args.tokenizer_pre)
    except ExportError as error:
        print(f"export_gguf: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
