"""Export a Hugging Face-style checkpoint (config.json, *.safetensors, tokenizer.json) to GGUF.

The benchmark compares Shrike and llama.cpp on the same weights: this writes them as an F16 or BF16
GGUF that llama.cpp loads directly, or that its own `llama-quantize` turns into Q4_0/Q8_0. A W4 checkpoint
(compressed-tensors pack-quantized, symmetric int4, groups a multiple of 32: `shrike synth --scheme
w4a8-g128`) exports with `--dtype q4_0` to the very same weights: a Q4_0 block of 32 is its int4 values + 8
and its group's scale in fp16 (exact for bf16 scales in fp16's range); dense matrices stay BF16 and the
output head is `--output-type` (q8_0 to match Shrike's `--lm-head-quant int8` in bytes read).

    python benchmarks/export_gguf.py MODEL_DIR OUT.gguf [--dtype bf16|f16|q4_0] [--output-type bf16|q8_0]

Llama checkpoints become the `llama` architecture; MiniCPM ones the `minicpm` architecture, which is
llama's graph plus MiniCPM's embedding, residual and logit scalings; Qwen3-MoE ones `qwen3moe`, whose
experts llama.cpp stores merged, one (experts, N, K) tensor per projection (`ffn_gate_exps` ...). Llama
and MiniCPM Q and K projections are permuted back into the rotary layout llama.cpp expects (the inverse
of what Hugging Face's conversion did); Qwen's rotate halves in both. The tokenizer must be a byte-level
BPE tokenizer.json (GPT-2 family).
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

from shrike.quantization.compressed_tensors_format import unpack_int

GGUF_ARCH_OF_MODEL_TYPE = {"llama": "llama", "minicpm": "minicpm", "qwen3_moe": "qwen3moe"}
# Architectures whose GGUF rotates interleaved pairs of Q and K (Hugging Face rotates halves).
PERMUTED_QK_ARCHS = ("llama", "minicpm")

Q = gguf.GGMLQuantizationType
FILE_TYPES = {
    "bf16": (Q.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "f16": (Q.F16, gguf.LlamaFileType.MOSTLY_F16),
    "q4_0": (Q.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
}
OUTPUT_TYPES = {"bf16": Q.BF16, "q8_0": Q.Q8_0}
INT4 = "INT4"  # the dtype name given here to a pack-quantized symmetric int4 matrix

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
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",  # the MoE router
}
EXPERT_NAME = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
EXPERT_TENSOR_NAMES = {"gate_proj": "ffn_gate_exps.weight", "up_proj": "ffn_up_exps.weight",
                       "down_proj": "ffn_down_exps.weight"}

LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# Buffers some checkpoints carry that llama.cpp recomputes itself.
IGNORED_TENSOR_SUFFIXES = (".rotary_emb.inv_freq",)


class ExportError(ValueError):
    """The checkpoint cannot be written as a GGUF that llama.cpp would run the same way."""


@dataclass(frozen=True)
class Source:
    """One weight of the checkpoint: the file holding it, its (N, K) or (N,) shape, its dtype name
    (safetensors' name, or INT4 for a pack-quantized matrix, whose scales are group_size wide)."""
    file: Path
    shape: tuple[int, ...]
    dtype: str
    group_size: int | None = None


@dataclass(frozen=True)
class TensorPlan:
    source_names: tuple[str, ...]  # several for a MoE layer's experts, merged in expert order
    gguf_name: str
    shape: tuple[int, ...]  # (experts, N, K) for merged experts
    rotary_heads: int | None  # Q/K projections: the head count to permute by; None for all other tensors


def gguf_tensor_name(hf_name: str) -> tuple[str, int | None] | None:
    """The GGUF name of a Hugging Face tensor name and, for a MoE expert, its index in the merged tensor;
    None for tensors llama.cpp does not load."""
    if hf_name.endswith(IGNORED_TENSOR_SUFFIXES):
        return None
    if hf_name in GLOBAL_TENSOR_NAMES:
        return GLOBAL_TENSOR_NAMES[hf_name], None
    match = LAYER_NAME.match(hf_name)
    if match and match.group(2) in LAYER_TENSOR_NAMES:
        return f"blk.{match.group(1)}.{LAYER_TENSOR_NAMES[match.group(2)]}", None
    expert = EXPERT_NAME.match(match.group(2)) if match else None
    if expert:
        return f"blk.{match.group(1)}.{EXPERT_TENSOR_NAMES[expert.group(2)]}", int(expert.group(1))
    raise ExportError(f"tensor {hf_name!r} has no llama.cpp equivalent")


def permute_for_rotary(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Hugging Face rotates the two halves of each head; llama.cpp rotates interleaved pairs."""
    rows = weight.shape[0]
    return (weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape))


def checkpoint_sources(model_dir: Path) -> dict[str, Source]:
    """Every weight of the checkpoint by its unquantized name (a pack-quantized `x.weight_packed`,
    `x.weight_scale`, `x.weight_shape` triple is the one weight `x.weight`)."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ExportError(f"{model_dir} has no .safetensors files")
    found = {}
    for file in files:
        with safe_open(file, framework="pt") as handle:
            names = set(handle.keys())
            for name in names:
                if name.endswith((".weight_scale", ".weight_shape")):
                    continue
                if name.endswith(".weight_packed"):
                    prefix = name.removesuffix("_packed")
                    if f"{prefix}_zero_point" in names:
                        raise ExportError(f"{prefix} has zero points; only symmetric int4 exports to Q4_0")
                    n, k = handle.get_tensor(f"{prefix}_shape").tolist()
                    if handle.get_slice(name).get_shape()[1] * 8 != k:
                        raise ExportError(f"{prefix} is not int4; only int4 pack-quantized weights export to Q4_0")
                    groups = handle.get_slice(f"{prefix}_scale").get_shape()[1]
                    found[prefix] = Source(file, (n, k), INT4, k // groups)
                    continue
                sliced = handle.get_slice(name)
                found[name] = Source(file, tuple(sliced.get_shape()), sliced.get_dtype())
    return found


def plan_tensors(config: dict, sources: dict[str, Source], dtype: str = "bf16") -> list[TensorPlan]:
    dense_ok = ("BF16", "F16", "F32") if dtype != "q4_0" else ("BF16", "F16", "F32", INT4)
    refused = sorted(name for name, source in sources.items() if source.dtype not in dense_ok)
    if refused:
        raise ExportError(f"only unquantized checkpoints export (or int4 ones with --dtype q4_0); "
                          f"{refused[0]} is {sources[refused[0]].dtype}")
    odd_groups = sorted(name for name, s in sources.items() if s.dtype == INT4 and (s.group_size or 1) % 32)
    if odd_groups:
        raise ExportError(f"{odd_groups[0]} has groups of {sources[odd_groups[0]].group_size}; "
                          "Q4_0 blocks of 32 need groups of a multiple of 32")
    if dtype == "q4_0" and not any(s.dtype == INT4 for s in sources.values()):
        raise ExportError("--dtype q4_0 copies int4 weights; this checkpoint has none "
                          "(make one with `shrike synth` or `shrike quantize` and a w4 scheme)")
    permuted = GGUF_ARCH_OF_MODEL_TYPE.get(config.get("model_type")) in PERMUTED_QK_ARCHS
    rotary_heads = {"attn_q.weight": config["num_attention_heads"],
                    "attn_k.weight": config.get("num_key_value_heads", config["num_attention_heads"])} if permuted else {}
    tied = config.get("tie_word_embeddings", False)
    singles, experts = [], {}
    for name, source in sources.items():
        target = gguf_tensor_name(name)
        if target is None or (tied and target[0] == "output.weight"):
            continue
        gguf_name, expert = target
        if expert is None:
            singles.append(TensorPlan((name,), gguf_name, source.shape, rotary_heads.get(gguf_name.split(".", 2)[-1])))
        else:
            experts.setdefault(gguf_name, {})[expert] = name
    for gguf_name, by_expert in experts.items():
        if sorted(by_expert) != list(range(len(by_expert))):
            raise ExportError(f"{gguf_name}: the checkpoint's expert indices are not 0..{len(by_expert) - 1}")
        names = tuple(by_expert[e] for e in range(len(by_expert)))
        singles.append(TensorPlan(names, gguf_name, (len(names), *sources[names[0]].shape), None))
    return sorted(singles, key=lambda plan: _gguf_order(plan.gguf_name))


def _gguf_order(name: str) -> tuple[int, str]:
    """Global tensors first, then blocks in numeric order, as llama.cpp's converter writes them."""
    match = re.match(r"blk\.(\d+)\.", name)
    return (int(match.group(1)) + 1 if match else 0, name)


def storage_type(plan: TensorPlan, sources: dict[str, Source], weight_type: Q, output_type: Q) -> Q:
    # llama.cpp keeps norms (all 1-D tensors) in F32, as its own converter does
    if len(plan.shape) == 1:
        return Q.F32
    if plan.gguf_name == "output.weight" and weight_type == Q.Q4_0:
        return output_type
    if sources[plan.source_names[0]].dtype == INT4:
        return Q.Q4_0
    return Q.BF16 if weight_type == Q.Q4_0 else weight_type  # dense matrices of an int4 checkpoint stay exact


def tensor_bytes(tensor: torch.Tensor, qtype: Q) -> np.ndarray:
    if qtype == Q.F32:
        return tensor.to(torch.float32).numpy()
    if qtype == Q.F16:
        return tensor.to(torch.float16).numpy()
    if qtype == Q.Q8_0:  # in slices of rows, to bound the float32 temporaries
        rows = max(1, (1 << 22) // tensor.shape[-1])
        return np.concatenate([gguf.quants.quantize(tensor[i:i + rows].float().numpy(), Q.Q8_0)
                               for i in range(0, tensor.shape[0], rows)])
    # BF16 has no numpy dtype: its bit patterns travel as uint16, unchanged
    return tensor.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def q4_0_blocks(values: torch.Tensor, scales: torch.Tensor) -> np.ndarray:
    """Symmetric int4 values (N, K) in [-8, 7] with scales (N, K/G) -> Q4_0 bytes (N, K/32 * 18): per block of
    32 its fp16 scale, then byte j = (value j + 8) | (value j+16 + 8) << 4. The weights are unchanged."""
    n, k = values.shape
    blocks = k // 32
    scale = scales.repeat_interleave(k // scales.shape[1] // 32, dim=1)  # (N, K/32)
    half = scale.to(torch.float16)
    if not torch.equal(half.float(), scale.float()):
        raise ExportError("a weight scale is not exact in fp16 (Q4_0 stores fp16 scales)")
    nibbles = (values + 8).to(torch.uint8).reshape(n, blocks, 2, 16)
    packed = nibbles[:, :, 0] | (nibbles[:, :, 1] << 4)  # (N, K/32, 16)
    return torch.cat([half.view(torch.uint8).reshape(n, blocks, 2), packed], dim=2).reshape(n, -1).numpy()


def numpy_dtype(qtype: Q) -> np.dtype:
    return np.dtype({Q.F32: np.float32, Q.F16: np.float16, Q.BF16: np.uint16}.get(qtype, np.uint8))


def stored_shape(shape: tuple[int, ...], qtype: Q) -> tuple[int, ...]:
    """The numpy shape of a tensor's bytes: block-quantized types store (..., K / block * block bytes) bytes."""
    if qtype not in (Q.Q4_0, Q.Q8_0):
        return shape
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    return (*shape[:-1], shape[-1] // block * block_bytes)


def source_bytes(name: str, source: Source, qtype: Q, rotary_heads: int | None) -> np.ndarray:
    with safe_open(source.file, framework="pt") as handle:
        if source.dtype == INT4:
            values = unpack_int(handle.get_tensor(f"{name}_packed"), 4, source.shape[1])
            return q4_0_blocks(values, handle.get_tensor(f"{name}_scale"))
        weight = handle.get_tensor(name)
    if rotary_heads:
        weight = permute_for_rotary(weight, rotary_heads)
    return tensor_bytes(weight, qtype)


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
    if config.get("model_type") == "qwen3_moe":
        writer.add_expert_count(config["num_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
        if not config.get("norm_topk_prob", False) or config.get("mlp_only_layers") or \
                config.get("decoder_sparse_step", 1) != 1:
            raise ExportError("llama.cpp's qwen3moe renormalises the top-k weights and has experts in every layer; "
                              "this checkpoint has norm_topk_prob false, mlp_only_layers or decoder_sparse_step")
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


def export(model_dir: Path, out_path: Path, dtype: str = "bf16", tokenizer_pre: str | None = None,
           output_type: str = "bf16") -> Path:
    config = json.loads((model_dir / "config.json").read_text())
    arch = GGUF_ARCH_OF_MODEL_TYPE.get(config.get("model_type"))
    if arch is None:
        raise ExportError(f"model_type {config.get('model_type')!r} is not exported; "
                          f"supported: {', '.join(GGUF_ARCH_OF_MODEL_TYPE)}")
    weight_type, file_type = FILE_TYPES[dtype]
    sources = checkpoint_sources(model_dir)
    plans = plan_tensors(config, sources, dtype)
    types = [storage_type(plan, sources, weight_type, OUTPUT_TYPES[output_type]) for plan in plans]

    writer = gguf.GGUFWriter(str(out_path), arch)
    write_model_metadata(writer, config, file_type, model_dir.name)
    write_tokenizer_metadata(writer, model_dir, config["vocab_size"], tokenizer_pre)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for plan, qtype in zip(plans, types):
        element_dtype, shape = numpy_dtype(qtype), stored_shape(plan.shape, qtype)
        writer.add_tensor_info(plan.gguf_name, shape, element_dtype, math.prod(shape) * element_dtype.itemsize,
                               raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    # One tensor (one layer's merged experts) in memory at a time, so multi-GB checkpoints export in little memory
    for plan, qtype in zip(plans, types):
        parts = [source_bytes(name, sources[name], qtype, plan.rotary_heads) for name in plan.source_names]
        writer.write_tensor_data(np.stack(parts) if len(parts) > 1 else parts[0])
    writer.close()
    return out_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="export_gguf", description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path, help="directory with config.json, *.safetensors, tokenizer.json")
    parser.add_argument("out", type=Path, help="GGUF file to write")
    parser.add_argument("--dtype", choices=sorted(FILE_TYPES), default="bf16",
                        help="storage type of the matrices (norms stay F32); default bf16, the exact weights; "
                             "q4_0 copies an int4 checkpoint's weights exactly")
    parser.add_argument("--output-type", choices=sorted(OUTPUT_TYPES), default="bf16",
                        help="with --dtype q4_0: the output head's type (q8_0 reads as many bytes as Shrike's "
                             "--lm-head-quant int8)")
    parser.add_argument("--tokenizer-pre", default=None,
                        help="llama.cpp pre-tokenizer name (default: recognised from tokenizer.json)")
    args = parser.parse_args(argv)
    try:
        export(args.model_dir, args.out, args.dtype, args.tokenizer_pre, args.output_type)
    except ExportError as error:
        print(f"export_gguf: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
