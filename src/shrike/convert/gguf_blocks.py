"""GGUF quant blocks as integer values with a float32 scale (and min) per group: the form Shrike's
grouped kernels read (csrc/grouped_linear), without changing a single weight.

Every type here dequantizes as W[n, j] = scale[n, g] * values[n, j] - min[n, g] (g = j // group),
computed in float32 exactly as `gguf.quants.dequantize` computes it: the products d * sc and
dmin * m of the K-quants are exact in float32, so scale and min are those products and the
dequantized weights are equal bit for bit. Where every scale and min of a weight is exact in fp16 (the
types whose blocks hold fp16 scales), the packed weight keeps them as fp16, the file's own size. The
types with superblocks of 256 also give their fp16 d (and dmin): the packed weight then holds the integer
factors sc, m (ls - 32 for IQ4_XS) per group and d, dmin per superblock, as the file does.

| type   | group | values        | scale        | min        |
|--------|-------|---------------|--------------|------------|
| Q4_0   | 32    | q - 8         | d            | -          |
| Q4_1   | 32    | q (0..15)     | d            | -m         |
| Q5_0   | 32    | q - 16        | d            | -          |
| Q5_1   | 32    | q (0..31)     | d            | -m         |
| Q8_0   | 32    | q             | d            | -          |
| Q4_K   | 32    | q (0..15)     | d * sc       | dmin * m   |
| Q5_K   | 32    | q (0..31)     | d * sc       | dmin * m   |
| Q6_K   | 16    | q - 32        | d * sc       | -          |
| IQ4_NL | 32    | grid[q]       | d            | -          |
| IQ4_XS | 32    | grid[q]       | d * (ls-32)  | -          |

IQ4_NL's and IQ4_XS's values are levels of a 16-entry grid (IQ4_GRID); they are packed as their 4-bit
indices (``codebook``), which the kernels look up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

# IQ4_NL / IQ4_XS's 16 non-linear levels (llama.cpp's kvalues_iq4nl)
IQ4_GRID = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)


@dataclass
class GroupedBlocks:
    values: np.ndarray  # (n, k) int8
    scale: np.ndarray  # (n, k // group) float32
    min: np.ndarray | None  # (n, k // group) float32, or None when the type has no min
    group: int  # 16 or 32
    bits: int  # the type's value bits as packed: 4 (0..15 with a min, -8..7 without), 6 (0..63, -32..31) or 8
    type_name: str  # the GGUF type they came from
    d: np.ndarray | None = None  # (n, k // 256) float32 superblock scales (K-quants, IQ4_XS): scale = d * integer
    dmin: np.ndarray | None = None  # (n, k // 256) float32 superblock mins (Q4_K, Q5_K): min = dmin * integer
    codebook: bool = False  # values are IQ4_GRID levels, packed as their 4-bit indices (bits 4, no min)

    def dequantize(self) -> np.ndarray:
        """(n, k) float32 weights, as gguf.quants.dequantize gives them."""
        n, k = self.values.shape
        w = self.values.reshape(n, -1, self.group).astype(np.float32) * self.scale[..., None]
        if self.min is not None:
            w = w - self.min[..., None]
        return w.reshape(n, k)

    def rows(self, index: np.ndarray) -> "GroupedBlocks":
        """These weights with their rows reordered (a permutation of the output features)."""
        def pick(a):
            return None if a is None else a[index]
        return GroupedBlocks(self.values[index], self.scale[index], pick(self.min), self.group, self.bits,
                             self.type_name, pick(self.d), pick(self.dmin), self.codebook)


def _f16(column: np.ndarray) -> np.ndarray:
    """(blocks, 2) bytes of a float16 field -> (blocks,) float32."""
    return np.ascontiguousarray(column).view(np.float16).astype(np.float32)[:, 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(blocks, 16 * c) bytes -> (blocks, 32 * c): per 16 bytes, their low nibbles then their high ones."""
    blocks = qs.shape[0]
    qs = qs.reshape(blocks, -1, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (qs & 0x0F).reshape(blocks, -1)


def _high_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """(blocks, 4) little-endian uint32 bit fields -> (blocks, count) bits."""
    bits = np.ascontiguousarray(qh).view(np.uint32) >> np.arange(count, dtype=np.uint32)[None, :]
    return (bits & 1).astype(np.uint8)


def _q4_0(b):
    return _nibbles(b[:, 2:]).astype(np.int8) - 8, _f16(b[:, :2])[:, None], None


def _q4_1(b):
    return _nibbles(b[:, 4:]).astype(np.int8), _f16(b[:, :2])[:, None], -_f16(b[:, 2:4])[:, None]


def _q5_0(b):
    q = _nibbles(b[:, 6:]) | _high_bits(b[:, 2:6], 32) << 4
    return q.astype(np.int8) - 16, _f16(b[:, :2])[:, None], None


def _q5_1(b):
    q = _nibbles(b[:, 8:]) | _high_bits(b[:, 4:8], 32) << 4
    return q.astype(np.int8), _f16(b[:, :2])[:, None], -_f16(b[:, 2:4])[:, None]


def _q8_0(b):
    return b[:, 2:].view(np.int8), _f16(b[:, :2])[:, None], None


def _k_scales_mins(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes -> the 8 sub-blocks' 6-bit scales and mins, (blocks, 8) each.
    Bytes 0-3 hold scales 0-3 (low 6 bits) and the top bits of scales 4-7, bytes 4-7 the same for the
    mins, bytes 8-11 the low 4 bits of scales 4-7 (low nibble) and mins 4-7 (high nibble)."""
    s = scales.reshape(-1, 3, 4)
    first, second, low = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([first & 0x3F, (low & 0x0F) | ((first >> 2) & 0x30)], axis=1)
    mn = np.concatenate([second & 0x3F, (low >> 4) | ((second >> 2) & 0x30)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _k_low_nibbles(qs: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K's 128 bytes -> 256 nibbles: per 32 bytes, the low nibbles (one sub-block) then the high."""
    blocks = qs.shape[0]
    qs = qs.reshape(blocks, -1, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (qs & 0x0F).reshape(blocks, -1)


def _q4_k(b):
    sc, mn = _k_scales_mins(b[:, 4:16])
    d, dmin = _f16(b[:, :2])[:, None], _f16(b[:, 2:4])[:, None]
    return _k_low_nibbles(b[:, 16:]).astype(np.int8), d * sc, dmin * mn, d, dmin


def _q5_k(b):
    sc, mn = _k_scales_mins(b[:, 4:16])
    d, dmin = _f16(b[:, :2])[:, None], _f16(b[:, 2:4])[:, None]
    blocks = b.shape[0]
    # bit s of the 32 qh bytes is the fifth bit of sub-block s
    high = (b[:, 16:48].reshape(blocks, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    q = _k_low_nibbles(b[:, 48:]) | high.reshape(blocks, -1) << 4
    return q.astype(np.int8), d * sc, dmin * mn, d, dmin


def _q6_k(b):
    blocks = b.shape[0]
    ql, qh, sc, d = b[:, :128], b[:, 128:192], b[:, 192:208], b[:, 208:210]
    # per half of 128 values: 64 low nibbles then 64 high nibbles of ql; 2-bit pairs of qh by shift 0, 2, 4, 6
    low = (ql.reshape(blocks, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F
    high = (qh.reshape(blocks, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    q = low.reshape(blocks, -1) | high.reshape(blocks, -1) << 4
    d = _f16(d)[:, None]
    return q.astype(np.int8) - 32, d * sc.view(np.int8).astype(np.float32), None, d, None


def _iq4_nl(b):
    return IQ4_GRID[_nibbles(b[:, 2:])], _f16(b[:, :2])[:, None], None


def _iq4_xs(b):
    blocks = b.shape[0]
    d = _f16(b[:, :2])[:, None]
    high = (np.ascontiguousarray(b[:, 2:4]).view(np.uint16) >> (2 * np.arange(8, dtype=np.uint16))[None, :]) & 3
    low = (b[:, 4:8].reshape(blocks, 4, 1) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2)).reshape(blocks, 8) & 0x0F
    ls = (low | (high.astype(np.uint8) << 4)).astype(np.float32) - 32
    return IQ4_GRID[_nibbles(b[:, 8:])], d * ls, None, d, None


# type -> (block bytes, values per block, group, bits, decoder)
TYPES = {
    T.Q4_0: (18, 32, 32, 4, _q4_0),
    T.Q4_1: (20, 32, 32, 4, _q4_1),
    T.Q5_0: (22, 32, 32, 6, _q5_0),
    T.Q5_1: (24, 32, 32, 6, _q5_1),
    T.Q8_0: (34, 32, 32, 8, _q8_0),
    T.Q4_K: (144, 256, 32, 4, _q4_k),
    T.Q5_K: (176, 256, 32, 6, _q5_k),
    T.Q6_K: (210, 256, 16, 6, _q6_k),
    T.IQ4_NL: (18, 32, 32, 4, _iq4_nl),
    T.IQ4_XS: (136, 256, 32, 4, _iq4_xs),
}
CODEBOOK_TYPES = {T.IQ4_NL, T.IQ4_XS}


def grouped_blocks(data: np.ndarray, tensor_type: T, n: int, k: int) -> GroupedBlocks:
    """A GGUF tensor's raw bytes ((n, row bytes) uint8, as GGUFReader gives them) of a type in TYPES."""
    block_bytes, per_block, group, bits, decode = TYPES[tensor_type]
    blocks = np.ascontiguousarray(data).reshape(n * (k // per_block), block_bytes)
    values, scale, mins, *superblock = decode(blocks)
    d, dmin = superblock or (None, None)

    def per(a, columns):
        return None if a is None else np.ascontiguousarray(a, dtype=np.float32).reshape(n, columns)
    values = np.ascontiguousarray(values, dtype=np.int8).reshape(n, k)
    return GroupedBlocks(values, per(scale, k // group), per(mins, k // group), group, bits, tensor_type.name,
                         per(d, k // 256), per(dmin, k // 256), tensor_type in CODEBOOK_TYPES)
