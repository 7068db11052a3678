"""safetensors files tensor by tensor: a streaming writer and plain reads that leave no mapping behind.

The writer lays out the header from the tensor specs first, so a multi-gigabyte checkpoint is
written while only one tensor is in memory. Plain reads (not mmap) are for weights that are
converted once at load: their pages then do not stay in the process's resident set.
"""
from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from shrike.errors import ConfigError

DTYPE_CODES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int8: "I8",
               torch.uint8: "U8", torch.int32: "I32", torch.int64: "I64",
               torch.float8_e4m3fn: "F8_E4M3"}
DTYPES_BY_CODE = {code: dtype for dtype, code in DTYPE_CODES.items()}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return _count(self.shape) * torch.empty((), dtype=self.dtype).element_size()


def read_header(path: Path) -> tuple[dict, int]:
    """(header dict, offset of the data region) of a safetensors file, checked against the file's size.

    A truncated or garbled file is a ConfigError naming it, before any tensor is read from it.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise _damaged(path, f"{size} bytes, shorter than a header")
        (length,) = struct.unpack("<Q", prefix)
        if length > size - 8:
            raise _damaged(path, f"its header claims {length} bytes but the file has {size}")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, ValueError):
            raise _damaged(path, "its header is not valid JSON") from None
    if not isinstance(header, dict):
        raise _damaged(path, "its header is not a JSON object")
    data_start = 8 + length
    try:
        data_end = max((entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"),
                       default=0)
    except (TypeError, KeyError, IndexError):
        raise _damaged(path, "its header lacks tensor offsets") from None
    if not isinstance(data_end, int) or data_start + data_end > size:
        raise _damaged(path, f"it is truncated: its tensors need {data_start + data_end} bytes but the file has "
                             f"{size}")
    return header, data_start


def _damaged(path: Path, reason: str) -> ConfigError:
    return ConfigError(f"{path} is not a valid safetensors file ({reason}); re-download or re-convert the checkpoint")


def read_tensor_into(path: Path, name: str, header: dict, data_start: int, out: torch.Tensor) -> None:
    """Read one tensor with plain file I/O into `out` (contiguous, of the tensor's dtype and size)."""
    entry = header[name]
    begin, end = entry["data_offsets"]
    if not out.is_contiguous() or out.dtype != DTYPES_BY_CODE[entry["dtype"]] or out.numel() != _count(entry["shape"]):
        raise ValueError(f"cannot read {name!r} ({entry['dtype']} {entry['shape']}) into {out.dtype} {tuple(out.shape)}")
    if begin == end:
        return
    with open(path, "rb") as f:
        f.seek(data_start + begin)
        if f.readinto(memoryview(out.view(torch.uint8).reshape(-1).numpy())) != end - begin:
            raise ValueError(f"{path} is truncated inside tensor {name!r}")


def _count(shape: list[int]) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


class CheckpointFiles:
    """Where each tensor of a checkpoint directory lives, read with plain file I/O."""

    def __init__(self, model_dir: Path):
        self.model_dir = Path(model_dir)
        self.files = sorted(self.model_dir.glob("*.safetensors"))
        self.headers: dict[Path, tuple[dict, int]] = {path: read_header(path) for path in self.files}
        self._location = {name: path for path, (header, _) in self.headers.items() for name in header
                          if name != "__metadata__"}

    def __contains__(self, name: str) -> bool:
        return name in self._location

    def names(self) -> list[str]:
        return list(self._location)

    def entry(self, name: str) -> dict:
        """The header entry of a tensor: dtype code, shape, data_offsets."""
        path = self._location[name]
        return self.headers[path][0][name]

    def read(self, name: str) -> torch.Tensor:
        """A private copy of one tensor."""
        entry = self.entry(name)
        out = torch.empty(tuple(entry["shape"]), dtype=DTYPES_BY_CODE[entry["dtype"]])
        self.read_into(name, out)
        return out

    def read_into(self, name: str, out: torch.Tensor) -> None:
        path = self._location[name]
        header, data_start = self.headers[path]
        read_tensor_into(path, name, header, data_start, out)


class StreamingSafetensorsWriter:
    """Writes tensors in the order of `specs`, one `write` call each, then `close`."""

    def __init__(self, path: Path, specs: list[TensorSpec], metadata: dict[str, str] | None = None):
        header: dict = {"__metadata__": metadata or {"format": "pt"}}
        offset = 0
        for spec in specs:
            header[spec.name] = {"dtype": DTYPE_CODES[spec.dtype], "shape": list(spec.shape),
                                 "data_offsets": [offset, offset + spec.nbytes]}
            offset += spec.nbytes
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)  # the data region starts 8-byte aligned
        self._pending = list(specs)
        self._file = open(path, "wb")
        self.path = path
        self.crc32 = 0  # of the bytes written so far, for callers that keep a checksum
        self.size = 0
        self._emit(struct.pack("<Q", len(encoded)) + encoded)

    def _emit(self, data) -> None:
        self._file.write(data)
        self.crc32 = zlib.crc32(data, self.crc32)
        self.size += len(data)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        spec = self._pending.pop(0)
        if (spec.name, spec.dtype, spec.shape) != (name, tensor.dtype, tuple(tensor.shape)):
            raise ValueError(f"expected {spec} next, got {name} {tensor.dtype} {tuple(tensor.shape)}")
        if tensor.numel():
            self._emit(tensor.contiguous().view(torch.uint8).reshape(-1).numpy().data)

    def close(self) -> None:
        self._file.close()
        if self._pending:
            raise ValueError(f"{self.path}: {len(self._pending)} tensors were never written, first {self._pending[0].name}")
