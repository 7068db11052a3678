"""`shrike quantize`: a bf16/fp32 checkpoint in, a compressed-tensors W4A8, W8A8, W4A16 or W8A16 checkpoint out."""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from shrike.errors import ConfigError
from shrike.model.config import ModelConfig
from shrike.model.moe import MOE_ARCHITECTURES, quantizable_linears, router_ignore
from shrike.quantization.calibration import input_statistics
from shrike.quantization.compressed_tensors_format import (
    check_format, default_format, matches_any, pack_int, quantization_config, stored_tensor_names,
    stored_tensor_specs)
from shrike.quantization.gptq import gptq_quantize
from shrike.quantization.quantizer import SCALE_SEARCHES, quantize_weight
from shrike.quantization.safetensors_io import (
    DTYPES_BY_CODE, CheckpointFiles, StreamingSafetensorsWriter, TensorSpec)
from shrike.quantization.schemes import SCHEMES, QuantScheme, scheme_from_name
from shrike.quantization.smoothing import apply_transform, can_scale, norm_offsets, search_factors

LINEAR_NAMES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
METHODS = ("rtn", "gptq", "awq")
# Weights are what quantization changes; these describe the model and travel with it.
_NOT_COPIED = ("config.json", "model.safetensors.index.json")


def add_quantize_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", type=Path, help="model directory with bf16/fp16/fp32 safetensors")
    p.add_argument("dst", type=Path, help="output directory (created; must not hold a checkpoint already)")
    p.add_argument("--scheme", required=True, choices=list(SCHEMES),
                   help="w4a8-gG / w8a8: int4 per group of G or int8 per channel, with dynamic int8 activations; "
                   "w4a16-gG / w8a16: the same weights with 16-bit activations (weight-only, more accurate)")
    p.add_argument("--format", default=None, choices=["pack-quantized", "int-quantized"],
                   help="integers packed in int32 words, or one per int8 (default: pack-quantized for int4, "
                   "int-quantized for int8, as llm-compressor writes them)")
    p.add_argument("--ignore", nargs="*", default=["lm_head"], metavar="LAYER",
                   help="linear layers kept unquantized: names or 're:' regexes (default: lm_head)")
    p.add_argument("--scale-search", default=None, choices=list(SCALE_SEARCHES),
                   help="how each group's scale is chosen: minmax is llm-compressor's rule (absmax / (L + 0.5)); "
                   "clip keeps the candidate with the smallest error, weighted by the --calibration inputs, among "
                   "ranges from min-max down to 0.55 of it; mse only within one step of the largest weight; absmax "
                   "maps the largest weight to the top level (default: clip with --calibration, else minmax)")
    p.add_argument("--method", default="rtn", choices=list(METHODS),
                   help="rtn: round each weight to the nearest level (default); gptq: round column by column, "
                   "moving each rounding error onto the columns not yet rounded so that the layer's output on the "
                   "--calibration text changes least (needs --calibration; slower); awq: scale each input channel by "
                   "a power of its mean activation, searched per layer on the --calibration text, so that the weights "
                   "of large activations round finely, then round to nearest (needs --calibration)")
    p.add_argument("--calibration", type=Path, default=None, metavar="TEXT_FILE",
                   help="text to run the model on first: its inputs weight the scale search and feed --method gptq; "
                   "for W4A8/W8A8 with --method rtn/gptq on Llama-family and Gemma 3 models it also enables "
                   "activation smoothing (SmoothQuant, strength searched per layer)")


def linear_prefixes(config: ModelConfig) -> list[str]:
    if config.architecture in MOE_ARCHITECTURES:
        return quantizable_linears(config)
    return [f"model.layers.{i}.{name}" for i in range(config.num_layers) for name in LINEAR_NAMES]


def quantize_checkpoint(src: Path, dst: Path, scheme: QuantScheme, fmt: str | None = None,
                        ignore: list[str] = ("lm_head",), scale_search: str | None = None,
                        calibration_text: str | None = None,
                        progress: bool = True, method: str = "rtn") -> None:
    if method not in METHODS:
        raise ConfigError(f"unknown quantization method {method!r}; use {' or '.join(METHODS)}")
    if method in ("gptq", "awq") and calibration_text is None:
        raise ConfigError(f"--method {method} needs --calibration TEXT_FILE: it minimises the error on real inputs")
    if scale_search is None:  # unweighted searches can lose to min-max (see shrike.quantization.quantizer)
        scale_search = "minmax" if calibration_text is None else "clip"
    config = ModelConfig.from_dir(src)
    if calibration_text is not None and config.architecture in MOE_ARCHITECTURES:
        raise ConfigError("calibration (--calibration, --method gptq) is not supported for mixture-of-experts models; "
                          "quantize them with round to nearest")
    if config.quantization_config is not None:
        raise ConfigError(f"{src} is already quantized ({config.quantization_config.get('quant_method')}); "
                          "quantize an unquantized checkpoint")
    fmt = fmt or default_format(scheme)
    check_format(scheme, fmt)
    if not config.tie_word_embeddings and not matches_any("lm_head", list(ignore)):
        raise ConfigError("quantizing lm_head is not supported; keep lm_head in --ignore")
    if (dst / "config.json").exists():
        raise ConfigError(f"{dst} already holds a checkpoint; choose an empty output directory")
    files = CheckpointFiles(src)
    targets = [p for p in linear_prefixes(config) if not matches_any(p, list(ignore))]
    widths = {files.entry(f"{prefix}.weight")["shape"][1] for prefix in targets}
    for prefix in targets:
        scheme.check_in_features(files.entry(f"{prefix}.weight")["shape"][1], prefix)
    ragged = sorted(k for k in widths if scheme.group_size and k % scheme.group_size)
    if ragged:
        print(f"shrike: {scheme.name}: layers {ragged[0]} wide get a shorter last group per row; Shrike runs them, "
              "compressed-tensors 0.20 cannot dequantize such files (it needs widths divisible by the group)",
              file=sys.stderr)

    transforms, input_power, hessians = {}, {}, {}
    if calibration_text is not None:
        # Smoothing moves activation outliers into the weights: a gain only when activations are quantized.
        family = "awq" if method == "awq" else None if scheme.weight_only else "smoothquant"
        family = family if can_scale(config) else None
        stats = input_statistics(src, calibration_text, gram=method == "gptq", samples=family is not None)
        if family is not None:
            transforms = search_factors(files, config, stats, scheme, family)
        for prefix in targets:
            seen = stats[_input_owner(prefix)]
            # Smoothing divides each channel's activations by the factor its weight column is multiplied by.
            factor = transforms[f"{prefix}.weight"][0] if transforms else torch.ones_like(seen.power)
            input_power[prefix] = seen.power / factor.square()
            if seen.gram is not None:
                hessians[prefix] = seen.gram / (factor[:, None] * factor[None, :])

    offsets = {name: offset for name, offset in norm_offsets(config).items() if offset} if transforms else {}
    target_weights = {f"{p}.weight": p for p in targets}
    specs: list[TensorSpec] = []
    steps: list[tuple[str, str]] = []  # ("quantize", layer prefix) or ("copy", tensor name), in file order
    for path in files.files:
        for name, entry in files.headers[path][0].items():
            if name == "__metadata__":
                continue
            if name in target_weights:
                n, k = entry["shape"]
                specs += stored_tensor_specs(target_weights[name], n, k, scheme, fmt, DTYPES_BY_CODE[entry["dtype"]])
                steps.append(("quantize", target_weights[name]))
            else:
                dtype = torch.float32 if name in transforms and name in offsets else DTYPES_BY_CODE[entry["dtype"]]
                specs.append(TensorSpec(name, dtype, tuple(entry["shape"])))
                steps.append(("copy", name))

    dst.mkdir(parents=True, exist_ok=True)
    writer = StreamingSafetensorsWriter(dst / "model.safetensors", specs)
    bar = tqdm(total=len(targets), desc=f"Quantizing to {scheme.name}", unit="layer", disable=not progress)
    for kind, name in steps:
        if kind == "copy":
            tensor = files.read(name)
            writer.write(name, apply_transform(tensor, transforms[name], offsets.get(name, 0.0))
                         if name in transforms else tensor)
            continue
        weight = files.read(f"{name}.weight")  # (N, K)
        if f"{name}.weight" in transforms:
            weight = apply_transform(weight, transforms[f"{name}.weight"])
        if method == "gptq":
            values, scales = gptq_quantize(weight, hessians[name], scheme, weight.dtype, scale_search)
        else:
            values, scales = quantize_weight(weight, scheme, weight.dtype, scale_search, input_power.get(name))
        tensors = [pack_int(values, scheme.weight_bits), scales, torch.tensor(values.shape, dtype=torch.int64)] \
            if fmt == "pack-quantized" else [values, scales]
        for stored_name, tensor in zip(stored_tensor_names(name, fmt), tensors):
            writer.write(stored_name, tensor)
        bar.update()
    writer.close()
    bar.close()

    raw = dict(config.raw)
    moe_routers = [router_ignore(config)] if config.architecture in MOE_ARCHITECTURES else []
    raw["quantization_config"] = quantization_config(scheme, fmt, list(ignore) + moe_routers)
    (dst / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    for path in src.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name not in _NOT_COPIED:
            shutil.copy2(path, dst / path.name)


def _input_owner(prefix: str) -> str:
    """The prefix under which the fused layer reading the same input recorded its activations."""
    layer, name = prefix.rsplit(".", 1)
    first = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}.get(name, name)
    return f"{layer}.{first}"


def run_quantize(args: argparse.Namespace) -> int:
    calibration = None
    if args.calibration is not None:
        if not args.calibration.is_file():
            raise ConfigError(f"--calibration {args.calibration} is not a file")
        calibration = args.calibration.read_text(encoding="utf-8")
    quantize_checkpoint(args.src, args.dst, scheme_from_name(args.scheme), args.format, args.ignore, args.scale_search,
                        calibration, method=args.method)
    print(f"wrote {args.dst}")
    return 0
