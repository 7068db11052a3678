"""Low-bit linear kernels of the Shrike C++ core (W4A8 and W8A8), with their thread pool, and the
packed weight forms of the other linear ops (weight-only, a GGUF file's blocks for the grouped kernel, bf16
tiles of the AMX-BF16 dense kernel).

Weights are repacked once at load into interleaved tiles (``csrc/linear/layout.h``) held as a
plain contiguous ``uint8`` tensor, so a cache can save them with safetensors (``tensors()``)
and memory-map them back (``from_tensors()``). Activations are quantized per row on every call:
asymmetric int8 (KleidiAI ``qai8dxp`` rule) for W4A8, symmetric int8 (vLLM CPU rule) for W8A8.

The C++ side picks the best compiled variant the CPU runs (``active_isa()``); ``SHRIKE_ISA`` or
``set_isa()`` forces one. All variants give bit-identical results to the scalar reference.
Tensors are passed to C++ without copies (DLPack); a wrong dtype, shape or layout raises
``TypeError`` / ``ValueError``.
"""

from __future__ import annotations

import torch

from shrike import _C
from shrike.platform.cpulist import parse_cpu_list

__all__ = [
    "W4A8Weight",
    "W8A8Weight",
    "WeightOnlyWeight",
    "GroupedWeight",
    "GroupedParts",
    "DenseTileWeight",
    "linear",
    "quantize_activations",
    "active_isa",
    "available_isas",
    "set_isa",
    "set_threads",
    "get_threads",
]

# Stored next to the packed bytes; bump when csrc/linear/layout.h changes.
LAYOUT_VERSION = 1
GROUP_SIZES = (32, 64, 128)


def active_isa() -> str:
    """Name of the kernel level in use: scalar, avx2, avxvnni, avx512vnni, avx512bf16, amx, dotprod, i8mm or sve2."""
    return _C.active_isa()


def available_isas() -> list[str]:
    """Variants compiled into this build that this CPU can run."""
    return list(_C.available_isas())


def set_isa(name: str) -> None:
    """Force a kernel variant; ``ValueError`` naming the available ones if it cannot run here."""
    _C.set_isa(name)


def describe() -> dict:
    """What the kernel core runs on this CPU, for shrike doctor."""
    return {
        "features": dict(_C.cpu_features()),
        "active_isa": _C.active_isa(),
        # The variant can depend on the row count (Arm I8MM, x86 AMX).
        "linear_variants": {
            scheme: {"decode_m1": _C.linear_variant(scheme, 1), "prefill": _C.linear_variant(scheme, 512)}
            for scheme in ("w4a8", "w8a8")
        },
        # Unquantized layers and the lm_head, by model dtype: "amx" is the AMX-BF16 tile order.
        "dense_variants": {dtype: _C.dense_variant(dtype, dtype) for dtype in ("bfloat16", "float32")},
        # paged_attention by (query, cache) dtype at head_dim 128; "amx" is the AMX-BF16 tile walk.
        "attention_variants": {f"{q} queries, {cache} cache": _C.attention_variant(q, cache, 128)
                               for q, cache in (("bfloat16", "bfloat16"), ("bfloat16", "int8"), ("float32", "float32"))},
        "available_isas": list(_C.available_isas()),
        # Each op's variants table, best first: a call runs the first whose level the active level includes
        # and whose condition holds.
        "variant_tables": {op: [{"variant": name, "condition": condition} for name, condition in variants]
                           for op, variants in _C.variant_tables()},
    }


def set_threads(n: int | None = None, cpu_bind: str | None = None) -> None:
    """Size the kernel thread pool and optionally pin it.

    n: threads running kernels, the calling thread included; default: one per CPU in
    ``cpu_bind`` if given, else one per CPU this process may use (sched_getaffinity).
    cpu_bind: CPU list such as ``"0,1,6-11"``; pool worker i (1 <= i < n) is pinned to the
    i-th listed CPU. The calling thread is not pinned, so PyTorch threads created later keep
    the process mask. Workers spin briefly after a call, then sleep, so they do not compete
    with PyTorch's own threads between kernel calls. Call it while no kernel is running.
    """
    cpus = parse_cpu_list(cpu_bind) if cpu_bind else []
    if n is None:
        n = len(cpus) if cpus else len(_C.usable_cpus())
    _C.set_threads(int(n), cpus)


def get_threads() -> int:
    """Number of threads (the caller included) that run kernels."""
    return _C.num_threads()


def _check_tensor(t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU, got {t.device}")
    return t.detach()


def _float32_scale(scale, name: str) -> torch.Tensor:
    scale = _check_tensor(scale, name)
    if scale.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got {scale.dtype}")
    # bf16/fp16 -> fp32 is exact, so the kernels keep the checkpoint's scale values.
    return scale.to(torch.float32).contiguous()


def _exact_in_f16(values: torch.Tensor) -> bool:
    """Whether every float32 value is exactly an fp16 number (NaN and out-of-range values are not)."""
    return bool(torch.equal(values.to(torch.float16).to(torch.float32).view(torch.int32), values.view(torch.int32)))


def _check_group(group_size: int, k: int) -> int:
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size}")
    if k % group_size:
        raise ValueError(f"K={k} is not a multiple of group_size={group_size}")
    return group_size


class W4A8Weight:
    """int4 weights [N, K], symmetric, one scale per ``group_size`` consecutive K of a row."""

    def __init__(self, packed: torch.Tensor, n: int, k: int, group_size: int):
        packed = _check_tensor(packed, "packed")
        _check_group(group_size, k)
        expected = _C.w4a8_packed_bytes(n, k, group_size)
        if packed.dtype != torch.uint8 or packed.shape != (expected,) or not packed.is_contiguous():
            raise ValueError(
                f"packed must be a contiguous uint8 tensor of shape ({expected},) for N={n}, K={k}, "
                f"group {group_size}; got {packed.dtype} {tuple(packed.shape)}"
            )
        self.packed, self.n, self.k, self.group_size = packed, n, k, group_size

    @classmethod
    def from_int8(cls, weight: torch.Tensor, scale: torch.Tensor, group_size: int) -> "W4A8Weight":
        """compressed-tensors int-quantized: weight (N, K) int8 holding [-8, 7], scale (N, K/G)."""
        weight = _check_tensor(weight, "weight")
        if weight.dim() != 2:
            raise ValueError(f"weight must be 2-D (N, K), got shape {tuple(weight.shape)}")
        n, k = weight.shape
        _check_group(group_size, k)
        packed = torch.empty(_C.w4a8_packed_bytes(n, k, group_size), dtype=torch.uint8)
        _C.w4a8_pack_int8(weight, _float32_scale(scale, "scale").reshape(n, -1), group_size, packed)
        return cls(packed, n, k, group_size)

    @classmethod
    def from_packed_int32(cls, weight_packed: torch.Tensor, scale: torch.Tensor, group_size: int) -> "W4A8Weight":
        """compressed-tensors pack-quantized: (N, K/8) int32, element i at bits 4i stored as value + 8."""
        weight_packed = _check_tensor(weight_packed, "weight_packed")
        if weight_packed.dim() != 2:
            raise ValueError(f"weight_packed must be 2-D (N, K/8), got shape {tuple(weight_packed.shape)}")
        n, k = weight_packed.shape[0], weight_packed.shape[1] * 8
        _check_group(group_size, k)
        packed = torch.empty(_C.w4a8_packed_bytes(n, k, group_size), dtype=torch.uint8)
        _C.w4a8_pack_int32(weight_packed, _float32_scale(scale, "scale").reshape(n, -1), group_size, packed)
        return cls(packed, n, k, group_size)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Plain tensors to save (e.g. with safetensors); inverse of ``from_tensors``."""
        meta = torch.tensor([LAYOUT_VERSION, self.n, self.k, self.group_size], dtype=torch.int64)
        return {"packed": self.packed, "meta": meta}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> "W4A8Weight":
        version, n, k, group_size = (int(v) for v in tensors["meta"].tolist())
        if version != LAYOUT_VERSION:
            raise ValueError(f"packed W4A8 layout version {version}, this build reads {LAYOUT_VERSION}")
        return cls(tensors["packed"], n, k, group_size)

    def unpack(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight (N, K) int8 in [-8, 7], scale (N, K/G) float32)."""
        weight = torch.empty(self.n, self.k, dtype=torch.int8)
        scale = torch.empty(self.n, self.k // self.group_size, dtype=torch.float32)
        _C.w4a8_unpack(self.packed, self.n, self.k, self.group_size, weight, scale)
        return weight, scale

    def __repr__(self) -> str:
        return f"W4A8Weight(N={self.n}, K={self.k}, group_size={self.group_size})"


class W8A8Weight:
    """int8 weights [N, K], symmetric, one float32 scale per output row."""

    def __init__(self, packed: torch.Tensor, n: int, k: int):
        packed = _check_tensor(packed, "packed")
        if k % 16:
            raise ValueError(f"K={k} is not a multiple of 16")
        expected = _C.w8a8_packed_bytes(n, k)
        if packed.dtype != torch.uint8 or packed.shape != (expected,) or not packed.is_contiguous():
            raise ValueError(
                f"packed must be a contiguous uint8 tensor of shape ({expected},) for N={n}, K={k}; "
                f"got {packed.dtype} {tuple(packed.shape)}"
            )
        self.packed, self.n, self.k = packed, n, k

    @classmethod
    def from_int8(cls, weight: torch.Tensor, scale: torch.Tensor) -> "W8A8Weight":
        """compressed-tensors W8A8: weight (N, K) int8, scale (N, 1) or (N,)."""
        weight = _check_tensor(weight, "weight")
        if weight.dim() != 2:
            raise ValueError(f"weight must be 2-D (N, K), got shape {tuple(weight.shape)}")
        n, k = weight.shape
        if k % 16:
            raise ValueError(f"K={k} is not a multiple of 16")
        scale = _float32_scale(scale, "scale")
        if scale.numel() != n:
            raise ValueError(f"scale must have N={n} elements, got shape {tuple(scale.shape)}")
        packed = torch.empty(_C.w8a8_packed_bytes(n, k), dtype=torch.uint8)
        _C.w8a8_pack(weight, scale.reshape(n), packed)
        return cls(packed, n, k)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Plain tensors to save (e.g. with safetensors); inverse of ``from_tensors``."""
        return {"packed": self.packed, "meta": torch.tensor([LAYOUT_VERSION, self.n, self.k], dtype=torch.int64)}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> "W8A8Weight":
        version, n, k = (int(v) for v in tensors["meta"].tolist())
        if version != LAYOUT_VERSION:
            raise ValueError(f"packed W8A8 layout version {version}, this build reads {LAYOUT_VERSION}")
        return cls(tensors["packed"], n, k)

    def unpack(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight (N, K) int8, scale (N, 1) float32)."""
        weight = torch.empty(self.n, self.k, dtype=torch.int8)
        scale = torch.empty(self.n, dtype=torch.float32)
        _C.w8a8_unpack(self.packed, self.n, self.k, weight, scale)
        return weight, scale.reshape(self.n, 1)

    def __repr__(self) -> str:
        return f"W8A8Weight(N={self.n}, K={self.k})"


class WeightOnlyWeight:
    """int4 / int8 weights [N, K] for 16-bit activations (W4A16 / W8A16), dequantized in registers.

    W[c, j] = (u[c, j] - zero) * scale of (c, j's group), computed as one fma with offset = -zero * scale;
    u is unsigned (int4: value + 8, two per byte, low nibble first, the compressed-tensors bit order;
    int8: value + 128). ``perm`` (act-order checkpoints): column j of W multiplies x[:, perm[j]].
    """

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, perm: torch.Tensor | None,
                 bits: int, n: int, k: int, group_size: int):
        self.q = _check_tensor(q, "q")  # (N, K/2) or (N, K) uint8
        self.scale = _check_tensor(scale, "scale")  # (N, K/G) fp32
        self.offset = _check_tensor(offset, "offset")  # (N, K/G) fp32
        self.perm = None if perm is None else _check_tensor(perm, "perm")  # (K,) int32
        self.bits, self.n, self.k, self.group_size = bits, n, k, group_size

    @classmethod
    def from_int8(cls, values: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, bits: int,
                  group_size: int, perm: torch.Tensor | None = None) -> "WeightOnlyWeight":
        """values (N, K) int8 (signed, in the bits' range), scale (N, K/G), zero (N, K/G) signed or None."""
        n, k = values.shape
        bias = 1 << (bits - 1)
        unsigned = (values.to(torch.int16) + bias).to(torch.uint8)  # (N, K)
        q = (unsigned[:, 0::2] | (unsigned[:, 1::2] << 4)).contiguous() if bits == 4 else unsigned.contiguous()
        scale = _float32_scale(scale, "scale").reshape(n, k // group_size).contiguous()
        zero_u = (zero.float() if zero is not None else torch.zeros_like(scale)).reshape(n, -1) + bias
        offset = (-zero_u * scale).contiguous()  # exact: an integer below 2^9 times a bf16/fp16 scale
        perm = None if perm is None else perm.to(torch.int32).contiguous()
        return cls(q, scale, offset, perm, bits, n, k, group_size)

    def tensors(self) -> dict[str, torch.Tensor]:
        meta = torch.tensor([LAYOUT_VERSION, self.n, self.k, self.bits, self.group_size], dtype=torch.int64)
        out = {"q": self.q, "scale": self.scale, "offset": self.offset, "meta": meta}
        if self.perm is not None:
            out["perm"] = self.perm
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> "WeightOnlyWeight":
        version, n, k, bits, group_size = (int(v) for v in tensors["meta"].tolist())
        if version != LAYOUT_VERSION:
            raise ValueError(f"weight-only layout version {version}, this build reads {LAYOUT_VERSION}")
        return cls(tensors["q"], tensors["scale"], tensors["offset"], tensors.get("perm"), bits, n, k, group_size)

    def dequantize(self) -> torch.Tensor:
        """(N, K) fp32 in the kernel's column order: exactly the values the kernel multiplies by."""
        if self.bits == 4:
            u = torch.stack([self.q & 15, self.q >> 4], dim=-1).reshape(self.n, self.k)
        else:
            u = self.q
        g = self.group_size
        # fma(u, scale, offset): u * scale is exact in float64, so one float32 rounding as in the kernel.
        w = u.double().reshape(self.n, -1, g) * self.scale.double()[..., None] + self.offset.double()[..., None]
        return w.float().reshape(self.n, self.k)

    def __repr__(self) -> str:
        return f"WeightOnlyWeight(bits={self.bits}, N={self.n}, K={self.k}, group_size={self.group_size})"


def packed_table_args(weight) -> tuple:
    """(packed, n, k, group, bits, has_min, codebook, params code) of a GroupedWeight used as an embedding
    table (csrc/fused/fused.h packed_embedding)."""
    if isinstance(weight, GroupedWeight):
        return (weight.packed, weight.n, weight.k, weight.group_size, weight.bits, weight.has_min, weight.codebook,
                weight.params_code)
    raise TypeError(f"an embedding table is a tensor or a GroupedWeight, not {type(weight).__name__}")


# How a GroupedWeight holds its scales and mins, in the order of csrc GroupedParams.
GROUPED_PARAMS = ("float32", "float16", "factored")
GROUPED_SUPERBLOCK = 256  # K of a factored weight's d and dmin


def _factors_exactly(p: torch.Tensor, d: torch.Tensor) -> bool:
    """Whether every p (N, K/G) float32 is bit for bit d (N, K/256) times an integer in -128..127 (for a zero d,
    0 or -1: the one giving p's sign of zero, as csrc grouped_pack chooses)."""
    d = d.repeat_interleave(p.shape[1] // d.shape[1], dim=1)
    zero_factor = torch.where(torch.signbit(p) == torch.signbit(d), 0.0, -1.0)
    factor = torch.where(d == 0, zero_factor, torch.round(p / d))
    if not bool(((factor >= -128) & (factor <= 127)).all()):
        return False
    return bool(torch.equal((d * factor).view(torch.int32), p.view(torch.int32)))


class GroupedWeight:
    """Weights [N, K] kept as a GGUF file's quant blocks (shrike.convert.gguf_blocks): int8 values (or 4-bit
    ones: 0..15 with mins, -8..7 without; or 6-bit: 0..63, -32..31; or, ``codebook``, levels of the IQ4_NL grid
    held as 4-bit indices, without mins) with a scale and optionally a min per ``group_size`` (16 or 32)
    consecutive K of a row, W[c, j] = scale[c, g] * values[c, j] - min[c, g]; run against int8 activations
    quantized per 32 K (csrc/grouped_linear/grouped_linear.h). ``params`` says how scales and mins are held:
    "factored" as an fp16 d (dmin) per 256 K of a row times an int8 factor per group (the K-quants' and
    IQ4_XS's form), "float16" when every one is exact in fp16 (the types with fp16 block scales), else
    "float32"."""

    def __init__(self, packed: torch.Tensor, n: int, k: int, group_size: int, bits: int, has_min: bool,
                 params: str, codebook: bool = False):
        if params not in GROUPED_PARAMS:
            raise ValueError(f"params must be one of {GROUPED_PARAMS}, got {params!r}")
        packed = _check_tensor(packed, "packed")
        self.params_code = GROUPED_PARAMS.index(params)
        expected = _C.grouped_packed_bytes(n, k, group_size, bits, has_min, codebook, self.params_code)
        if packed.dtype != torch.uint8 or packed.shape != (expected,) or not packed.is_contiguous():
            raise ValueError(f"packed must be a contiguous uint8 tensor of shape ({expected},), got "
                             f"{packed.dtype} {tuple(packed.shape)}")
        self.packed, self.n, self.k, self.group_size, self.bits = packed, n, k, group_size, bits
        self.has_min, self.params, self.codebook = has_min, params, codebook

    @classmethod
    def from_values(cls, values: torch.Tensor, scale: torch.Tensor, min: torch.Tensor | None, group_size: int,
                    bits: int, d: torch.Tensor | None = None, dmin: torch.Tensor | None = None,
                    codebook: bool = False) -> "GroupedWeight":
        """values (N, K) int8 (bits 4: 0..15 with a min, -8..7 without; 6: 0..63, -32..31; codebook (bits 4, no
        min): each one of the IQ4_NL grid's 16 levels), scale and min (N, K / group_size)
        float32 (min may be None). d and dmin (N, K / 256): the superblock scales the K-quants multiply their
        integer group scales (and mins) by; given, exact in fp16 and factoring every scale (and min) exactly,
        the weight holds them factored, the smallest form."""
        n, k = values.shape
        scale = _float32_scale(scale, "scale")
        min = None if min is None else _float32_scale(min, "min")
        factored = d is not None and k % GROUPED_SUPERBLOCK == 0 and (min is None) == (dmin is None)
        if factored:
            d = _float32_scale(d, "d")
            dmin = None if dmin is None else _float32_scale(dmin, "dmin")
            factored = all(_exact_in_f16(s) and _factors_exactly(p, s) for p, s in ((scale, d), (min, dmin))
                           if p is not None)
        if factored:
            params = "factored"
        else:
            d = dmin = None
            params = "float16" if all(_exact_in_f16(p) for p in (scale, min) if p is not None) else "float32"
        code = GROUPED_PARAMS.index(params)
        packed = torch.empty(_C.grouped_packed_bytes(n, k, group_size, bits, min is not None, codebook, code),
                             dtype=torch.uint8)
        _C.grouped_pack(_check_tensor(values, "values").contiguous(), scale, min, group_size, bits, codebook, code,
                        packed, d, dmin)
        return cls(packed, n, k, group_size, bits, min is not None, params, codebook)

    def unpack(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(values (N, K) int8, scale (N, K/G) float32, min (N, K/G) float32 or None)."""
        values = torch.empty(self.n, self.k, dtype=torch.int8)
        scale = torch.empty(self.n, self.k // self.group_size, dtype=torch.float32)
        min = torch.empty_like(scale) if self.has_min else None
        _C.grouped_unpack(self.packed, self.n, self.k, self.group_size, self.bits, self.has_min, self.codebook,
                          self.params_code, values, scale, min)
        return values, scale, min

    def dequantize(self) -> torch.Tensor:
        """(N, K) float32 weights: scale * value - min, each step rounded to float32."""
        values, scale, min = self.unpack()
        w = values.reshape(self.n, -1, self.group_size).float() * scale[..., None]
        return (w if min is None else w - min[..., None]).reshape(self.n, self.k)

    def __repr__(self) -> str:
        return (f"GroupedWeight(N={self.n}, K={self.k}, group_size={self.group_size}, bits={self.bits}, "
                f"has_min={self.has_min}, codebook={self.codebook}, params={self.params!r})")


class GroupedParts:
    """The parts of one fused linear (q/k/v, gate/up) whose GGUF types pack differently, each a GroupedWeight
    over its own output columns, in order: one layer of the ``grouped`` format whose parts each keep their own
    file's bits (fusing them into one weight would hold every part at the widest part's). No bias."""

    def __init__(self, parts: list[GroupedWeight]):
        if len(parts) < 2 or len({p.k for p in parts}) != 1:
            raise ValueError("GroupedParts takes two or more GroupedWeights of one K")
        self.parts, self.n, self.k = parts, sum(p.n for p in parts), parts[0].k

    @property
    def nbytes(self) -> int:
        return sum(p.packed.numel() for p in self.parts)

    def dequantize(self) -> torch.Tensor:
        """(N, K) float32 weights, the parts' rows in order."""
        return torch.cat([p.dequantize() for p in self.parts])

    def __repr__(self) -> str:
        return f"GroupedParts({', '.join(map(repr, self.parts))})"


class DenseTileWeight:
    """bf16 weight [N, K] packed once for the AMX-BF16 dense kernel: per 16 outputs a panel of
    (Kp/2, 16, 2) bf16, tdpbf16ps's weight operand, Kp = K rounded up to 32, zeros past N and K
    (``csrc/dense/dense_tiles.h``). It replaces the (N, K) tensor; ``unpack()`` gives that back."""

    def __init__(self, tiles: torch.Tensor, n: int, k: int):
        tiles = _check_tensor(tiles, "tiles")
        expected = _C.dense_tiles_elements(n, k)
        if tiles.dtype != torch.bfloat16 or tiles.shape != (expected,) or not tiles.is_contiguous():
            raise ValueError(f"tiles must be a contiguous bfloat16 tensor of shape ({expected},) for N={n}, K={k}; "
                             f"got {tiles.dtype} {tuple(tiles.shape)}")
        self.tiles, self.n, self.k = tiles, n, k  # tiles: (panels * 16 * Kp,)

    @classmethod
    def from_dense(cls, weight: torch.Tensor) -> "DenseTileWeight":
        """weight (N, K) bfloat16."""
        weight = _check_tensor(weight, "weight")
        if weight.dtype != torch.bfloat16 or weight.dim() != 2:
            raise ValueError(f"weight must be a 2-D bfloat16 tensor (N, K), got {weight.dtype} {tuple(weight.shape)}")
        n, k = weight.shape
        tiles = torch.empty(_C.dense_tiles_elements(n, k), dtype=torch.bfloat16)
        _C.dense_pack_tiles(weight.contiguous(), tiles)
        return cls(tiles, n, k)

    def unpack(self) -> torch.Tensor:
        """The (N, K) bfloat16 weight."""
        weight = torch.empty(self.n, self.k, dtype=torch.bfloat16)
        _C.dense_unpack_tiles(self.tiles, weight)
        return weight

    def __repr__(self) -> str:
        return f"DenseTileWeight(N={self.n}, K={self.k})"


def _check_activations(x, k: int) -> torch.Tensor:
    x = _check_tensor(x, "x")
    if x.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"x must be float32 or bfloat16, got {x.dtype}")
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must have shape (M, {k}), got {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError("x must be contiguous (call .contiguous() first)")
    return x


def linear(
    x: torch.Tensor,
    weight: W4A8Weight | W8A8Weight,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """y (M, N) = x (M, K) . W^T (+ bias), x float32 or bfloat16, output float32 or bfloat16
    (default: x's dtype). Activations are quantized per row inside the call."""
    if not isinstance(weight, (W4A8Weight, W8A8Weight)):
        raise TypeError(f"weight must be a W4A8Weight or W8A8Weight, got {type(weight).__name__}")
    x = _check_activations(x, weight.k)
    out_dtype = out_dtype or x.dtype
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"out_dtype must be torch.float32 or torch.bfloat16, got {out_dtype}")
    if bias is not None:
        bias = _check_tensor(bias, "bias")
        if bias.shape != (weight.n,):
            raise ValueError(f"bias must have shape ({weight.n},), got {tuple(bias.shape)}")
        bias = bias.to(torch.float32).contiguous()
    out = torch.empty(x.shape[0], weight.n, dtype=out_dtype)
    if isinstance(weight, W4A8Weight):
        _C.w4a8_linear(x, weight.packed, weight.n, weight.group_size, bias, out)
    else:
        _C.w8a8_linear(x, weight.packed, weight.n, bias, out)
    return out


def quantize_activations(x: torch.Tensor, scheme: str = "w4a8", group_size: int = 128) -> dict[str, torch.Tensor]:
    """The per-row activation quantization the linear kernels run, exposed for tests.

    scheme "w4a8": {"q" int8 (M, K), "scale" (M,), "zero" int32 (M,), "group_sum" int32 (M, K/G)},
    x ~ (q - zero) * scale. scheme "w8a8": {"q", "scale"}, x ~ q * scale. K % 16 == 0.
    """
    if x is None or not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError("x must be a 2-D tensor (M, K)")
    m, k = x.shape
    x = _check_activations(x, k)
    if k % 16:
        raise ValueError(f"K={k} is not a multiple of 16")
    q = torch.empty(m, k, dtype=torch.int8)
    scale = torch.empty(m, dtype=torch.float32)
    if scheme == "w8a8":
        _C.quantize_sym(x, q, scale)
        return {"q": q, "scale": scale}
    if scheme != "w4a8":
        raise ValueError(f"scheme must be 'w4a8' or 'w8a8', got {scheme!r}")
    _check_group(group_size, k)
    zero = torch.empty(m, dtype=torch.int32)
    group_sum = torch.empty(m, k // group_size, dtype=torch.int32)
    _C.quantize_asym(x, group_size, q, scale, zero, group_sum)
    return {"q": q, "scale": scale, "zero": zero, "group_sum": group_sum}
