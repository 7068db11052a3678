"""`shrike synth`: random-weight checkpoints with a real model's exact shapes, for benchmarks and tests.

Quantized weights are drawn directly as integers and scales (no dense model is materialised)
and written tensor by tensor, so memory stays near one tensor. Integers are uniform in
[-L, L] (L = 7 for int4, 127 for int8) and scales are set so every dense or dequantized weight
has a standard deviation near 0.02: with RMSNorm before every block, each linear output then
has a standard deviation near 0.02 * sqrt(K) ~ 1 and the residual stream grows only like
sqrt(layers), which keeps activations finite over 42 layers.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import torch
from tqdm import tqdm

from shrike.errors import ConfigError
from shrike.quantization.compressed_tensors_format import (
    check_format, default_format, pack_int, quantization_config, stored_tensor_names, stored_tensor_specs)
from shrike.model.config import ModelConfig
from shrike.model.moe import MOE_ARCHITECTURES, router_ignore
from shrike.quantization.safetensors_io import StreamingSafetensorsWriter, TensorSpec
from shrike.quantization.schemes import SCHEMES, QuantScheme

WEIGHT_STD = 0.02
_SCALE_JITTER = 0.2  # scales vary by +-10% so that no kernel can rely on them being equal
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")

SHAPES = {
    "minicpm5-2b": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 42,
                    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 130560,
                    "tie_word_embeddings": False, "rope_theta": 5000000.0, "rms_norm_eps": 1e-6,
                    "max_position_embeddings": 32768},
    "smollm2-135m": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                     "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
                     "tie_word_embeddings": True, "rope_theta": 100000.0, "rms_norm_eps": 1e-5,
                     "max_position_embeddings": 8192},
    # Qwen3-30B-A3B: 128 experts of intermediate 768, 8 active per token (about 3.3 B of 30.5 B parameters)
    "qwen3-30b-a3b": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
                      "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
                      "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
                      "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                      "vocab_size": 151936, "tie_word_embeddings": False, "rope_theta": 1000000.0,
                      "rms_norm_eps": 1e-6, "max_position_embeddings": 40960},
    # For tests: every W4A8 group size divides its widths, and lm_head is a separate (ignored) layer.
    "tiny": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": False,
             "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 2048},
    "tiny-moe": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
                 "intermediate_size": 768, "moe_intermediate_size": 128, "num_experts": 8, "num_experts_per_tok": 2,
                 "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 49152,
                 "tie_word_embeddings": False, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
                 "max_position_embeddings": 2048},
}


def add_synth_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dst", type=Path, help="output directory")
    p.add_argument("--like", required=True, choices=list(SHAPES), help="whose shapes to copy")
    p.add_argument("--scheme", required=True, choices=[*SCHEMES, "bf16"])
    p.add_argument("--format", default=None, choices=["pack-quantized", "int-quantized"],
                   help="storage of quantized weights (default: pack-quantized for int4, int-quantized for int8)")
    p.add_argument("--layers", type=int, default=None, help="override the number of decoder layers")
    p.add_argument("--seed", type=int, default=0)


def synth_config(like: str, layers: int | None, scheme: QuantScheme | None, fmt: str, bos: int, eos: int) -> dict:
    shape = dict(SHAPES[like])
    if layers is not None:
        if layers < 1:
            raise ConfigError(f"--layers {layers}: a model needs at least one layer")
        shape["num_hidden_layers"] = layers
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              **shape, "attention_bias": False, "mlp_bias": False, "rope_scaling": None,
              "torch_dtype": "bfloat16", "bos_token_id": bos, "eos_token_id": eos}
    if scheme is not None:
        ignore = [] if shape["tie_word_embeddings"] else ["lm_head"]
        if config["architectures"][0] in MOE_ARCHITECTURES:
            ignore.append(router_ignore(ModelConfig.from_dict(config)))
        config["quantization_config"] = quantization_config(scheme, fmt, ignore)
    return config


def _linear_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """Linear name under model.layers.{i} -> (N, K) of one layer, in file order (the MLP's or experts' last)."""
    h, i = config["hidden_size"], config["intermediate_size"]
    q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    attention = {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
                 "self_attn.o_proj": (h, q)}
    if config["architectures"][0] not in MOE_ARCHITECTURES:
        return {**attention, "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h), "mlp.down_proj": (h, i)}
    e = config["moe_intermediate_size"]
    experts = {f"mlp.experts.{x}.{name}": shape for x in range(config["num_experts"])
               for name, shape in (("gate_proj", (e, h)), ("up_proj", (e, h)), ("down_proj", (h, e)))}
    return {**attention, **experts}


def _linear_tensors(prefix: str, n: int, k: int, scheme: QuantScheme | None, fmt: str,
                    gen: torch.Generator) -> list[tuple[str, torch.Tensor]]:
    if scheme is None:
        return [(f"{prefix}.weight", (torch.randn(n, k, generator=gen) * WEIGHT_STD).bfloat16())]
    level = scheme.max_level
    values = torch.randint(-level, level + 1, (n, k), dtype=torch.int8, generator=gen)  # (N, K)
    uniform_std = math.sqrt(((2 * level + 1) ** 2 - 1) / 12)
    groups = -(-k // scheme.group_size) if scheme.group_size else 1  # the last group of a row may be shorter
    jitter = 1 + _SCALE_JITTER * (torch.rand(n, groups, generator=gen) - 0.5)
    scales = (jitter * WEIGHT_STD / uniform_std).bfloat16()  # (N, ceil(K/G)) or (N, 1)
    stored = [pack_int(values, scheme.weight_bits), scales, torch.tensor([n, k], dtype=torch.int64)] if fmt == "pack-quantized" \
        else [values, scales]
    return list(zip(stored_tensor_names(prefix, fmt), stored))


def _padded_tokenizer(src: Path, dst: Path, vocab_size: int) -> None:
    """Copy the tokenizer, adding never-produced tokens so that it has vocab_size entries."""
    tokenizer = json.loads((src / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    used = max([*vocab.values(), *(t["id"] for t in tokenizer.get("added_tokens", []))]) + 1
    if used > vocab_size:
        raise ConfigError(f"the tokenizer has {used} tokens, more than the model's vocabulary of {vocab_size}")
    # No merge produces these, so encoding never yields them; decoding shows their names.
    vocab.update({f"<|unused_{i}|>": i for i in range(used, vocab_size)})
    (dst / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))


def synthesize(dst: Path, like: str, scheme_name: str, fmt: str | None = None, layers: int | None = None,
               seed: int = 0, progress: bool = True) -> None:
    from shrike.default_model import resolve_model
    scheme = None if scheme_name == "bf16" else SCHEMES[scheme_name]
    if scheme is not None:
        fmt = fmt or default_format(scheme)
        check_format(scheme, fmt)
    if (dst / "config.json").exists():
        raise ConfigError(f"{dst} already holds a checkpoint; choose an empty output directory")
    tokenizer_dir = resolve_model(None, weights=False)
    tokenizer_config = json.loads((tokenizer_dir / "config.json").read_text())
    config = synth_config(like, layers, scheme, fmt, tokenizer_config.get("bos_token_id", 1),
                          tokenizer_config.get("eos_token_id", 2))
    linears = _linear_shapes(config)
    if scheme is not None:
        for name, (_, k) in linears.items():
            scheme.check_in_features(k, name)
    h, vocab = config["hidden_size"], config["vocab_size"]

    # Every tensor, in file order, with a function that makes it.
    gen = torch.Generator().manual_seed(seed)
    steps = [("model.embed_tokens.weight", (vocab, h), lambda: _random_rows(vocab, h, gen))]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        steps.append((f"{p}.input_layernorm.weight", (h,), lambda: torch.ones(h, dtype=torch.bfloat16)))
        if config["architectures"][0] == "Qwen3MoeForCausalLM":  # Qwen3's RMSNorm of each q and k head
            d = config["head_dim"]
            steps += [(f"{p}.self_attn.{n}_norm.weight", (d,), lambda: torch.ones(d, dtype=torch.bfloat16)) for n in "qk"]
        for name in linears:
            if name in ("mlp.gate_proj", "mlp.experts.0.gate_proj"):
                steps.append((f"{p}.post_attention_layernorm.weight", (h,),
                              lambda: torch.ones(h, dtype=torch.bfloat16)))
            if name == "mlp.experts.0.gate_proj":  # the router: dense, never quantized
                experts = config["num_experts"]
                steps.append((f"{p}.mlp.gate.weight", (experts, h), lambda: _random_rows(experts, h, gen)))
            n, k = linears[name]
            steps.append((f"{p}.{name}", (n, k), lambda prefix=f"{p}.{name}", n=n, k=k:
                          _linear_tensors(prefix, n, k, scheme, fmt, gen)))
    steps.append(("model.norm.weight", (h,), lambda: torch.ones(h, dtype=torch.bfloat16)))
    if not config["tie_word_embeddings"]:
        steps.append(("lm_head.weight", (vocab, h), lambda: _random_rows(vocab, h, gen)))

    specs = []
    for name, shape, _ in steps:
        if len(shape) == 2 and not name.endswith(("embed_tokens.weight", "lm_head.weight", "mlp.gate.weight")):
            specs += [TensorSpec(f"{name}.weight", torch.bfloat16, shape)] if scheme is None \
                else stored_tensor_specs(name, *shape, scheme, fmt, torch.bfloat16)
        else:
            specs.append(TensorSpec(name, torch.bfloat16, shape))
    dst.mkdir(parents=True, exist_ok=True)
    writer = StreamingSafetensorsWriter(dst / "model.safetensors", specs)
    for name, _, make in tqdm(steps, desc=f"Writing {like} {scheme_name}", unit="tensor", disable=not progress):
        made = make()
        for tensor_name, tensor in (made if isinstance(made, list) else [(name, made)]):
            writer.write(tensor_name, tensor)
    writer.close()
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for file in _TOKENIZER_FILES:
        if (tokenizer_dir / file).is_file():
            shutil.copy2(tokenizer_dir / file, dst / file)
    _padded_tokenizer(tokenizer_dir, dst, vocab)


def _random_rows(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """(rows, cols) bf16 normal * WEIGHT_STD, drawn in slices to bound the float32 temporaries."""
    out = torch.empty(rows, cols, dtype=torch.bfloat16)
    step = max(1, (1 << 24) // cols)
    for start in range(0, rows, step):
        out[start:start + step] = torch.randn(min(step, rows - start), cols, generator=gen) * WEIGHT_STD
    return out


def run_synth(args: argparse.Namespace) -> int:
    synthesize(args.dst, args.like, args.scheme, args.format, args.layers, args.seed)
    print(f"wrote {args.dst}")
    return 0
