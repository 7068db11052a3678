"""safetensors files tensor by tensor: a streaming writer and plain reads that leave no mapping behind.

The writer lays out the header from the tensor specs first, so a multi-gigabyte checkpoint is
written while only one tensor is in memory. Plain reads (not mmap) are for weights that are
converted once at load: their pages then do not stay in the process's resident set.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPE_CODES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int8: "I8",
               torch.uint8: "U8", torch.int32: "I32", torch.int64: "I64"}
DTYPES_BY_CODE = {code: dtype for dtype, code in DTYPE_CODES.items()}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for d in self.shape:
            count *= d
        return count * torch.empty((), dtype=self.dtype).element_size()


def read_header(path: Path) -> tuple[dict, int]:
    """(header dict, offset of the data region) of a safetensors file."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length)), 8 + length


def read_tensor(path: Path, name: str, header: dict, data_start: int) -> torch.Tensor:
    """A private copy of one tensor, read with plain file I/O."""
    entry = header[name]
    begin, end = entry["data_offsets"]
    out = torch.empty(tuple(entry["shape"]), dtype=DTYPES_BY_CODE[entry["dtype"]])
    with open(path, "rb") as f:
        f.seek(data_start + begin)
        view = memoryview(out.view(torch.uint8).reshape(-1).numpy()) if out.numel() else memoryview(b"")
        if f.readinto(view) != end - begin:
            raise ValueError(f"{path} is truncated inside tensor {name!r}")
    return out


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

    def entry(self, name: str) -> dict:
        """The header entry of a tensor: dtype code, shape, data_offsets."""
        path = self._location[name]
        return self.headers[path][0][name]

    def read(self, name: str) -> torch.Tensor:
        path = self._location[name]
        header, data_start = self.headers[path]
        return read_tensor(path, name, header, data_start)


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
        self._file.write(struct.pack("<Q", len(encoded)) + encoded)
        self.path = path

    def write(self, name: str, tensor: torch.Tensor) -> None:
        spec = self._pending.pop(0)
        if (spec.name, spec.dtype, spec.shape) != (name, tensor.dtype, tuple(tensor.shape)):
            raise ValueError(f"expected {spec} next, got {name} {tensor.dtype} {tuple(tensor.shape)}")
        if tensor.numel():
            self._file.write(tensor.contiguous().view(torch.uint8).reshape(-1).numpy().data)

    def close(self) -> None:
        self._file.close()
        if self._pending:
            raise ValueError(f"{self.path}: {len(self._pending)} tensors were never written, first {self._pending[0].name}")
