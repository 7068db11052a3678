"""The compressed-tensors checkpoint format: quantization_config, int4 packing, per-layer tensors.

Read side: which scheme (if any) applies to a linear layer, and its stored integers and scales.
Write side: the quantization_config and tensors of a checkpoint that compressed-tensors reads.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from shrike.errors import ConfigError
from shrike.quantization.safetensors_io import DTYPES_BY_CODE, CheckpointFiles, TensorSpec
from shrike.quantization.schemes import SUPPORTED_SCHEMES_TEXT, W4A8_GROUP_SIZES, QuantScheme

QUANT_METHOD = "compressed-tensors"
# naive-quantized is the older name of int-quantized: integers stored one per int8.
FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")
SUPPORTED_TEXT = (f"Shrike loads {QUANT_METHOD} checkpoints in format int-quantized or pack-quantized with "
                  f"{SUPPORTED_SCHEMES_TEXT}")
SCALE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _unsupported(what: str) -> ConfigError:
    return ConfigError(f"{what} is not supported; {SUPPORTED_TEXT}")


def _scheme_of_group(name: str, group: dict) -> QuantScheme:
    weights = group.get("weights")
    if not weights:
        raise _unsupported(f"config group {name!r} without weight quantization")
    kind, bits = weights.get("type", "int"), weights.get("num_bits")
    if kind != "int":
        raise _unsupported(f"config group {name!r}: {kind} weights")
    if not weights.get("symmetric", True) or weights.get("dynamic", False):
        raise _unsupported(f"config group {name!r}: asymmetric or dynamic weight quantization")
    strategy, group_size = weights.get("strategy"), weights.get("group_size")
    if bits == 4 and strategy == "group" and group_size in W4A8_GROUP_SIZES:
        scheme = QuantScheme(4, group_size)
    elif bits == 8 and strategy == "channel":
        scheme = QuantScheme(8, None)
    else:
        raise _unsupported(f"config group {name!r}: {bits}-bit weights with strategy {strategy!r}"
                           + (f" and group_size {group_size}" if group_size else ""))
    acts = group.get("input_activations")
    # Weight-only checkpoints (W4A16) would silently gain activation quantization error here.
    if not acts or acts.get("type", "int") != "int" or acts.get("num_bits") != 8 \
            or acts.get("strategy") != "token" or not acts.get("dynamic", False):
        raise _unsupported(f"config group {name!r}: input activations {acts}")
    if group.get("output_activations"):
        raise _unsupported(f"config group {name!r}: output activation quantization")
    return scheme


def matches_any(module: str, patterns: list[str]) -> bool:
    """compressed-tensors target rules: 're:' regex, the module class (every layer here is a Linear), or the name."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], module):
                return True
        elif pattern == "Linear" or pattern == module:
            return True
    return False


@dataclass(frozen=True)
class LayerQuantization:
    scheme: QuantScheme
    format: str


class QuantizationPlan:
    """A checkpoint's quantization_config: which linear layers are quantized, how and how stored."""

    def __init__(self, quantization_config: dict):
        qc = quantization_config
        method = qc.get("quant_method")
        if method != QUANT_METHOD:
            raise _unsupported(f"quant_method {method!r}")
        if qc.get("kv_cache_scheme"):
            raise _unsupported("a quantized KV cache (kv_cache_scheme)")
        groups = qc.get("config_groups") or {}
        if not groups:
            raise ConfigError("quantization_config has no config_groups: nothing says how the weights are stored")
        default_format = qc.get("format")
        self.groups: list[tuple[list[str], LayerQuantization]] = []
        for name, group in groups.items():
            fmt = group.get("format") or default_format
            if fmt not in FORMATS:
                raise _unsupported(f"config group {name!r}: format {fmt!r}")
            self.groups.append((list(group.get("targets") or []), LayerQuantization(_scheme_of_group(name, group), fmt)))
        self.ignore: list[str] = list(qc.get("ignore") or [])

    def layer(self, module: str) -> LayerQuantization | None:
        """How a linear layer is stored; None when it stays in the model dtype."""
        if matches_any(module, self.ignore):
            return None
        for targets, layer in self.groups:
            if matches_any(module, targets):
                return layer
        return None


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """(N, K) int8 in [-8, 7] -> (N, ceil(K/8)) int32; element i of a word at bits 4i, stored as value + 8.

    Two elements per byte, low nibble first, and bytes viewed as little-endian int32 words
    (the byte order of every CPU Shrike runs on) give exactly that bit layout.
    """
    n, k = values.shape
    nibbles = torch.nn.functional.pad((values + 8).to(torch.uint8), (0, -k % 8))  # (N, K8) uint8 in [0, 15]
    return (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).view(torch.int32)


def unpack_int4(packed: torch.Tensor, in_features: int) -> torch.Tensor:
    """(N, ceil(K/8)) int32 -> (N, K) int8 in [-8, 7]."""
    octets = packed.contiguous().view(torch.uint8)  # (N, K8/2)
    nibbles = torch.stack([octets & 15, octets >> 4], dim=-1).reshape(packed.shape[0], -1)  # (N, K8)
    return nibbles[:, :in_features].to(torch.int8) - 8


@dataclass
class StoredLinear:
    """One (possibly fused) linear layer's integers and scales as the checkpoint stores them."""

    scheme: QuantScheme
    scale: torch.Tensor  # (N, K/G) or (N, 1), bf16/fp16/fp32 as stored
    in_features: int
    values: torch.Tensor | None = None  # (N, K) int8, int-quantized
    packed: torch.Tensor | None = None  # (N, K/8) int32, pack-quantized int4

    def int8_values(self) -> torch.Tensor:  # (N, K) int8
        return self.values if self.values is not None else unpack_int4(self.packed, self.in_features)


def _expect(files: CheckpointFiles, name: str, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...]) -> None:
    if name not in files:
        raise ConfigError(f"checkpoint in {files.model_dir} lacks tensor {name!r}")
    entry = files.entry(name)
    dtype = DTYPES_BY_CODE.get(entry["dtype"])
    if tuple(entry["shape"]) != shape or dtype not in dtypes:
        raise ConfigError(f"tensor {name!r} is {entry['dtype']} {tuple(entry['shape'])}, expected "
                          f"{'/'.join(str(d).removeprefix('torch.') for d in dtypes)} {shape}")


def read_stored_linear(files: CheckpointFiles, prefixes: list[str], layer: LayerQuantization,
                       out_features: list[int], in_features: int) -> StoredLinear:
    """The layers `prefixes` fused along the output dimension (q/k/v, gate/up), read straight into one buffer."""
    scheme = layer.scheme
    scheme.check_in_features(in_features, prefixes[0])
    groups = in_features // scheme.group_size if scheme.group_size else 1
    packed = layer.format == "pack-quantized"
    if packed and scheme.weight_bits != 4:
        raise _unsupported(f"{prefixes[0]}: pack-quantized {scheme.weight_bits}-bit weights")
    stored_name, stored_dtype, width = ("weight_packed", torch.int32, -(-in_features // 8)) if packed \
        else ("weight", torch.int8, in_features)
    for prefix, n in zip(prefixes, out_features):
        if f"{prefix}.weight_zero_point" in files:
            raise _unsupported(f"{prefix}: asymmetric weights (weight_zero_point)")
        _expect(files, f"{prefix}.weight_scale", (n, groups), SCALE_DTYPES)
        _expect(files, f"{prefix}.{stored_name}", (n, width), (stored_dtype,))
        if packed and f"{prefix}.weight_shape" in files:
            shape = files.read(f"{prefix}.weight_shape").tolist()
            if shape != [n, in_features]:
                raise ConfigError(f"{prefix}.weight_shape is {shape}, config.json implies {[n, in_features]}")
    integers = torch.empty(sum(out_features), width, dtype=stored_dtype)  # (N, K) int8 or (N, K/8) int32
    rows = 0
    for prefix, n in zip(prefixes, out_features):
        files.read_into(f"{prefix}.{stored_name}", integers[rows:rows + n])
        rows += n
    if not packed and scheme.weight_bits == 4 and (integers.min() < -8 or integers.max() > 7):
        raise ConfigError(f"{', '.join(prefixes)}: int-quantized weights hold values outside [-8, 7] "
                          "but the scheme is 4-bit")
    scales = [files.read(f"{p}.weight_scale") for p in prefixes]
    scale = scales[0] if len(scales) == 1 else torch.cat([s.float() for s in scales])  # (N, K/G) or (N, 1)
    return StoredLinear(scheme, scale, in_features, **{"packed" if packed else "values": integers})


def quantization_config(scheme: QuantScheme, fmt: str, ignore: list[str]) -> dict:
    """The config.json `quantization_config` of a checkpoint written by `shrike quantize` / `shrike synth`."""
    if scheme.weight_bits == 4:
        weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                   "group_size": scheme.group_size, "dynamic": False}
    else:
        weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel",
                   "group_size": None, "dynamic": False}
    activations = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "group_size": None,
                   "dynamic": True}
    return {"quant_method": QUANT_METHOD, "format": fmt, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": activations, "output_activations": None}},
            "ignore": list(ignore), "kv_cache_scheme": None}


def stored_tensor_names(prefix: str, fmt: str) -> list[str]:
    if fmt == "pack-quantized":
        return [f"{prefix}.weight_packed", f"{prefix}.weight_scale", f"{prefix}.weight_shape"]
    return [f"{prefix}.weight", f"{prefix}.weight_scale"]


def stored_tensor_specs(prefix: str, n: int, k: int, scheme: QuantScheme, fmt: str,
                        scale_dtype: torch.dtype) -> list[TensorSpec]:
    """Names, dtypes and shapes of the tensors that store the (N, K) weight of `prefix`."""
    names = stored_tensor_names(prefix, fmt)
    scale = TensorSpec(names[1], scale_dtype, (n, k // scheme.group_size if scheme.group_size else 1))
    if fmt == "pack-quantized":
        return [TensorSpec(names[0], torch.int32, (n, -(-k // 8))), scale, TensorSpec(names[2], torch.int64, (2,))]
    return [TensorSpec(names[0], torch.int8, (n, k)), scale]


def check_format(scheme: QuantScheme, fmt: str) -> None:
    if fmt == "pack-quantized" and scheme.weight_bits != 4:
        raise ConfigError(f"--format pack-quantized packs 4-bit weights; use int-quantized for {scheme.name}")
