"""The compressed-tensors checkpoint format: quantization_config, int4 packing, per-layer tensors.

Read side: which scheme (if any) applies to a linear layer, and its stored integers and scales.
Write side: the quantization_config and tensors of a checkpoint that compressed-tensors reads.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

import torch

from shrike.errors import ConfigError
from shrike.quantization.safetensors_io import DTYPES_BY_CODE, CheckpointFiles, TensorSpec
from shrike.quantization.schemes import W4A8_GROUP_SIZES, QuantScheme

QUANT_METHOD = "compressed-tensors"
# naive-quantized is the older name of int-quantized: integers stored one per int8 (or fp8 values).
INT_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")
FLOAT_FORMATS = ("float-quantized", "naive-quantized")
FORMATS = ("pack-quantized", "int-quantized", "float-quantized", "naive-quantized")
SUPPORTED_TEXT = (f"Shrike loads {QUANT_METHOD} checkpoints with int4 or int8 weights (pack-quantized or int-quantized) "
                  "per group of a multiple of 32 or per channel, symmetric or with weight_zero_point, optionally "
                  "act-ordered (weight_g_idx), with 16-bit activations (W4A16, W8A16) or dynamic per-token int8 "
                  "activations (W4A8, W8A8); and fp8 e4m3 weights (float-quantized) per tensor or channel with "
                  "dynamic per-token activations (FP8-dynamic)")
SCALE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _unsupported(what: str) -> ConfigError:
    return ConfigError(f"{what} is not supported; {SUPPORTED_TEXT}")


@dataclass(frozen=True)
class LayerQuantization:
    """How one linear layer's weights are stored and what the checkpoint does with its input activations."""

    weight_type: str  # "int" or "float" (fp8 e4m3)
    bits: int  # 4 or 8
    group_size: int | None  # input features sharing one scale; None: per output channel (or per tensor)
    symmetric: bool  # False: a weight_zero_point per scale
    activations: str | None  # "int8" or "fp8", dynamic per token; None: weight-only, 16-bit activations
    format: str

    @property
    def weight_only(self) -> bool:
        return self.activations is None

    @property
    def scheme(self) -> QuantScheme | None:
        """The W4A8 / W8A8 scheme whose kernels take these weights unchanged, if there is one."""
        if self.weight_type != "int" or not self.symmetric:
            return None
        if self.bits == 4 and self.group_size in W4A8_GROUP_SIZES:
            return QuantScheme(4, self.group_size)
        if self.bits == 8 and self.group_size is None:
            return QuantScheme(8, None)
        return None

    @property
    def name(self) -> str:
        if self.weight_type == "float":
            return "fp8"
        acts = "16" if self.weight_only else "8"
        group = f"-g{self.group_size}" if self.group_size else ""
        return f"w{self.bits}a{acts}{group}{'' if self.symmetric else '-asym'}"


def _activations_of_group(name: str, group: dict, weight_type: str) -> str | None:
    acts = group.get("input_activations")
    if not acts:
        return None
    kind, bits, strategy = acts.get("type", "int"), acts.get("num_bits"), acts.get("strategy")
    if bits == 8 and kind == "int" and weight_type == "int" and strategy == "token" and acts.get("dynamic", False):
        return "int8"
    # FP8 checkpoints: dynamic per token (FP8-dynamic), or one static scale per tensor, which
    # Shrike replaces by a dynamic per-token one (its int8 kernels quantize every row anyway).
    if bits == 8 and kind == "float" and weight_type == "float" and strategy in ("token", "tensor"):
        return "fp8"
    raise _unsupported(f"config group {name!r}: input activations {acts}")


def _scheme_of_group(name: str, group: dict, fmt: str) -> LayerQuantization:
    weights = group.get("weights")
    if not weights:
        raise _unsupported(f"config group {name!r} without weight quantization")
    kind, bits = weights.get("type", "int"), weights.get("num_bits")
    strategy, group_size = weights.get("strategy"), weights.get("group_size")
    if weights.get("dynamic", False):
        raise _unsupported(f"config group {name!r}: dynamic weight quantization")
    if group.get("output_activations"):
        raise _unsupported(f"config group {name!r}: output activation quantization")
    if kind == "float":
        if bits != 8 or strategy not in ("tensor", "channel") or not weights.get("symmetric", True):
            raise _unsupported(f"config group {name!r}: {bits}-bit float weights with strategy {strategy!r}")
        if fmt not in FLOAT_FORMATS:
            raise _unsupported(f"config group {name!r}: float weights in format {fmt!r}")
        return LayerQuantization("float", 8, None, True, _activations_of_group(name, group, kind), fmt)
    if kind != "int":
        raise _unsupported(f"config group {name!r}: {kind} weights")
    if fmt not in INT_FORMATS:
        raise _unsupported(f"config group {name!r}: int weights in format {fmt!r}")
    grouped = strategy == "group" and isinstance(group_size, int) and group_size > 0 and group_size % 32 == 0
    if bits not in (4, 8) or not (grouped or strategy in ("channel", "tensor")):
        raise _unsupported(f"config group {name!r}: {bits}-bit weights with strategy {strategy!r}"
                           + (f" and group_size {group_size}" if group_size else ""))
    symmetric = bool(weights.get("symmetric", True))
    if strategy == "tensor" and not symmetric:
        raise _unsupported(f"config group {name!r}: asymmetric per-tensor weights")
    return LayerQuantization("int", bits, group_size if grouped else None, symmetric,
                             _activations_of_group(name, group, kind), fmt)


def matches_any(module: str, patterns: list[str]) -> bool:
    """compressed-tensors target rules: 're:' regex, the module class (every layer here is a Linear), or the name."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], module):
                return True
        elif pattern == "Linear" or pattern == module:
            return True
    return False


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
            self.groups.append((list(group.get("targets") or []), _scheme_of_group(name, group, fmt)))
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
    k = values.shape[1]
    nibbles = torch.nn.functional.pad((values + 8).to(torch.uint8), (0, -k % 8))  # (N, K8) uint8 in [0, 15]
    return (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).view(torch.int32)


def unpack_int(packed: torch.Tensor, bits: int, in_features: int) -> torch.Tensor:
    """pack-quantized (N, ceil(K * bits / 32)) int32 -> (N, K) int8; element i at bits [bits*i, bits*(i+1)),
    stored as value + 2^(bits-1). For 4 and 8 bits no element crosses a byte."""
    octets = packed.contiguous().view(torch.uint8)  # (N, bytes)
    if bits == 8:
        return (octets[:, :in_features].to(torch.int16) - 128).to(torch.int8)
    nibbles = torch.stack([octets & 15, octets >> 4], dim=-1).reshape(packed.shape[0], -1)  # (N, K8)
    return nibbles[:, :in_features].to(torch.int8) - 8


@dataclass
class StoredLinear:
    """One (possibly fused) linear layer's weights and quantization parameters as the checkpoint stores them."""

    layer: LayerQuantization
    scale: torch.Tensor  # (N, K/G) or (N, 1), bf16/fp16/fp32 as stored (per-tensor scales repeated per row)
    in_features: int
    values: torch.Tensor | None = None  # (N, K) int8, int-quantized
    packed: torch.Tensor | None = None  # (N, K * bits / 32) int32, pack-quantized
    zero_point: torch.Tensor | None = None  # (N, K/G) or (N, 1) int8, signed; asymmetric weights only
    g_idx: torch.Tensor | None = None  # (K,) int64: the group of each input column (act-order)
    float_values: torch.Tensor | None = None  # (N, K) float8_e4m3fn, float-quantized

    @property
    def scheme(self) -> QuantScheme | None:
        return self.layer.scheme

    def int8_values(self) -> torch.Tensor:  # (N, K) int8
        return self.values if self.values is not None else unpack_int(self.packed, self.layer.bits, self.in_features)


def _expect(files: CheckpointFiles, name: str, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...]) -> None:
    if name not in files:
        raise ConfigError(f"checkpoint in {files.model_dir} lacks tensor {name!r}")
    entry = files.entry(name)
    dtype = DTYPES_BY_CODE.get(entry["dtype"])
    if tuple(entry["shape"]) != shape or dtype not in dtypes:
        raise ConfigError(f"tensor {name!r} is {entry['dtype']} {tuple(entry['shape'])}, expected "
                          f"{'/'.join(str(d).removeprefix('torch.') for d in dtypes)} {shape}")


def _read_zero_point(files: CheckpointFiles, prefix: str, layer: LayerQuantization, n: int, groups: int) -> torch.Tensor:
    """(n, groups) int8: pack-quantized packs zero points along the output dimension, int-quantized stores them."""
    name = f"{prefix}.weight_zero_point"
    if name not in files:
        raise ConfigError(f"{prefix}: the config says asymmetric weights but the checkpoint lacks {name!r}")
    zero = files.read(name)
    if layer.format == "pack-quantized" and zero.dtype == torch.int32 and zero.shape[0] != n:
        if tuple(zero.shape) != (-(-n * layer.bits // 32), groups):
            raise ConfigError(f"tensor {name!r} has shape {tuple(zero.shape)}, expected packed ({-(-n * layer.bits // 32)}, "
                              f"{groups})")
        zero = unpack_int(zero.t(), layer.bits, n).t()  # (n, groups)
    if tuple(zero.shape) != (n, groups) or zero.is_floating_point() and not torch.equal(zero, zero.round()):
        raise ConfigError(f"tensor {name!r} is {zero.dtype} {tuple(zero.shape)}, expected integers ({n}, {groups})")
    lowest, highest = -(1 << (layer.bits - 1)), (1 << (layer.bits - 1)) - 1
    if zero.min() < lowest or zero.max() > highest:
        raise ConfigError(f"tensor {name!r} holds zero points outside [{lowest}, {highest}]")
    return zero.to(torch.int8)


def _read_g_idx(files: CheckpointFiles, prefixes: list[str], in_features: int) -> torch.Tensor | None:
    names = [f"{p}.weight_g_idx" for p in prefixes]
    present = [n for n in names if n in files]
    if not present:
        return None
    if len(present) != len(names):
        raise ConfigError(f"only some of {', '.join(prefixes)} have weight_g_idx; they run as one fused GEMM")
    g_idx = [files.read(n).to(torch.int64) for n in names]
    if any(g.shape != (in_features,) for g in g_idx):
        raise ConfigError(f"{names[0]} must have shape ({in_features},)")
    if any(not torch.equal(g, g_idx[0]) for g in g_idx[1:]):
        raise ConfigError(f"{', '.join(prefixes)} have different weight_g_idx but run as one fused GEMM with one "
                          "input order; re-export them with the same activation order")
    return g_idx[0]


def _ragged_as_even_groups(layer: LayerQuantization, prefix: str, in_features: int) -> LayerQuantization:
    """Groups of G along an input width K that G does not divide (the last group of a row shorter, as
    compressed-tensors writes them) are the same weights in groups of gcd(G, K) with each scale repeated,
    which every kernel runs as they are: W4A8-G128 on a 576-wide model runs as G64 with pairs of equal scales."""
    even = math.gcd(layer.group_size, in_features)
    if even % 32:
        raise ConfigError(f"{prefix} has {in_features} input features; groups of {layer.group_size} need a width "
                          "that is a multiple of 32")
    return dataclasses.replace(layer, group_size=even)


def read_stored_linear(files: CheckpointFiles, prefixes: list[str], layer: LayerQuantization,
                       out_features: list[int], in_features: int) -> StoredLinear:
    """The layers `prefixes` fused along the output dimension (q/k/v, gate/up), read straight into one buffer."""
    if layer.weight_type == "float":
        return _read_float_linear(files, prefixes, layer, out_features, in_features)
    stored_group = layer.group_size
    if stored_group and in_features % stored_group:
        layer = _ragged_as_even_groups(layer, prefixes[0], in_features)
    groups = -(-in_features // stored_group) if stored_group else 1
    packed = layer.format == "pack-quantized"
    stored_name, stored_dtype, width = ("weight_packed", torch.int32, -(-in_features * layer.bits // 32)) if packed \
        else ("weight", torch.int8, in_features)
    scales = []
    for prefix, n in zip(prefixes, out_features):
        if layer.symmetric and f"{prefix}.weight_zero_point" in files \
                and files.read(f"{prefix}.weight_zero_point").count_nonzero():
            raise ConfigError(f"{prefix} has non-zero weight_zero_point but the config says symmetric")
        scale_name = f"{prefix}.weight_scale"
        if scale_name in files and files.entry(scale_name)["shape"] in ([], [1], [1, 1]):  # one scale per tensor
            scale = files.read(scale_name).reshape(1, 1).expand(n, groups)
        else:
            _expect(files, scale_name, (n, groups), SCALE_DTYPES)
            scale = files.read(scale_name)
        scales.append(scale)
        _expect(files, f"{prefix}.{stored_name}", (n, width), (stored_dtype,))
        if packed and f"{prefix}.weight_shape" in files:
            shape = files.read(f"{prefix}.weight_shape").tolist()
            if shape != [n, in_features]:
                raise ConfigError(f"{prefix}.weight_shape is {shape}, config.json implies {[n, in_features]}")
    integers = torch.empty(sum(out_features), width, dtype=stored_dtype)  # (N, K) int8 or (N, K*bits/32) int32
    rows = 0
    for prefix, n in zip(prefixes, out_features):
        files.read_into(f"{prefix}.{stored_name}", integers[rows:rows + n])
        rows += n
    if not packed and layer.bits == 4 and (integers.min() < -8 or integers.max() > 7):
        raise ConfigError(f"{', '.join(prefixes)}: int-quantized weights hold values outside [-8, 7] "
                          "but the scheme is 4-bit")
    scale = scales[0] if len(scales) == 1 else torch.cat([s.float() for s in scales])  # (N, K/G) or (N, 1)
    zero = None if layer.symmetric else torch.cat(
        [_read_zero_point(files, p, layer, n, groups) for p, n in zip(prefixes, out_features)])
    g_idx = _read_g_idx(files, prefixes, in_features)
    if layer.group_size != stored_group:
        if g_idx is not None:
            raise ConfigError(f"{prefixes[0]}: act-ordered weights (weight_g_idx) need a group size dividing the "
                              f"{in_features} input features, not {stored_group}")
        stored_of_even = torch.arange(in_features // layer.group_size) * layer.group_size // stored_group
        scale = scale[:, stored_of_even]
        zero = None if zero is None else zero[:, stored_of_even]
    return StoredLinear(layer, scale, in_features, zero_point=zero, g_idx=g_idx,
                        **{"packed" if packed else "values": integers})


def _read_float_linear(files: CheckpointFiles, prefixes: list[str], layer: LayerQuantization,
                       out_features: list[int], in_features: int) -> StoredLinear:
    values = torch.empty(sum(out_features), in_features, dtype=torch.float8_e4m3fn)  # (N, K)
    scales, rows = [], 0
    for prefix, n in zip(prefixes, out_features):
        _expect(files, f"{prefix}.weight", (n, in_features), (torch.float8_e4m3fn,))
        scale_name = f"{prefix}.weight_scale"
        if scale_name not in files:
            raise ConfigError(f"checkpoint in {files.model_dir} lacks tensor {scale_name!r}")
        scale = files.read(scale_name)
        if scale.numel() == 1:
            scale = scale.reshape(1, 1).expand(n, 1)
        elif tuple(scale.shape) not in ((n, 1), (n,)):
            raise ConfigError(f"tensor {scale_name!r} has shape {tuple(scale.shape)}, expected one scale per tensor "
                              f"or ({n}, 1)")
        scales.append(scale.float().reshape(n, 1))
        files.read_into(f"{prefix}.weight", values[rows:rows + n])
        rows += n
    return StoredLinear(layer, torch.cat(scales), in_features, float_values=values)


def quantization_config(scheme: QuantScheme, fmt: str, ignore: list[str]) -> dict:
    """The config.json `quantization_config` of a checkpoint written by `shrike quantize` / `shrike synth`."""
    if scheme.weight_bits == 4:
        weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                   "group_size": scheme.group_size, "dynamic": False}
    else:
        weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel",
                   "group_size": None, "dynamic": False}
    activations = None if scheme.weight_only else \
        {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "group_size": None, "dynamic": True}
    return {"quant_method": QUANT_METHOD, "format": fmt, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": activations, "output_activations": None}},
            "ignore": list(ignore), "kv_cache_scheme": None}


def default_format(scheme: QuantScheme) -> str:
    """What llm-compressor writes for the scheme: int4 packed in int32 words, int8 one per byte."""
    return "pack-quantized" if scheme.weight_bits == 4 else "int-quantized"


def pack_int(values: torch.Tensor, bits: int) -> torch.Tensor:
    """(N, K) int8 -> pack-quantized (N, ceil(K * bits / 32)) int32 (the inverse of unpack_int)."""
    if bits == 4:
        return pack_int4(values)
    octets = torch.nn.functional.pad((values.to(torch.int16) + 128).to(torch.uint8), (0, -values.shape[1] % 4))
    return octets.contiguous().view(torch.int32)


def stored_tensor_names(prefix: str, fmt: str) -> list[str]:
    if fmt == "pack-quantized":
        return [f"{prefix}.weight_packed", f"{prefix}.weight_scale", f"{prefix}.weight_shape"]
    return [f"{prefix}.weight", f"{prefix}.weight_scale"]


def stored_tensor_specs(prefix: str, n: int, k: int, scheme: QuantScheme, fmt: str,
                        scale_dtype: torch.dtype) -> list[TensorSpec]:
    """Names, dtypes and shapes of the tensors that store the (N, K) weight of `prefix`."""
    names = stored_tensor_names(prefix, fmt)
    scale = TensorSpec(names[1], scale_dtype, (n, -(-k // scheme.group_size) if scheme.group_size else 1))
    if fmt == "pack-quantized":
        words = -(-k * scheme.weight_bits // 32)
        return [TensorSpec(names[0], torch.int32, (n, words)), scale, TensorSpec(names[2], torch.int64, (2,))]
    return [TensorSpec(names[0], torch.int8, (n, k)), scale]


def check_format(scheme: QuantScheme, fmt: str) -> None:
    if fmt not in ("pack-quantized", "int-quantized"):
        raise ConfigError(f"--format {fmt!r} is not written by Shrike; use pack-quantized or int-quantized")
