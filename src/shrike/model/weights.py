"""Named tensors of a checkpoint: spread over memory-mapped safetensors files, or converted from a GGUF file's."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from shrike.convert.gguf import GGUFModel
from shrike.errors import ConfigError
from shrike.quantization.safetensors_io import read_header


class NamedTensors:
    def raw(self, name: str) -> torch.Tensor:
        """The tensor as stored (dtype and shape of the file)."""
        raise NotImplementedError

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        t = self.raw(name)
        if tuple(t.shape) != tuple(shape):
            raise ConfigError(f"tensor {name!r} has shape {tuple(t.shape)} but config.json implies {tuple(shape)}")
        return t.to(dtype)


class CheckpointTensors(NamedTensors):
    def __init__(self, model_dir: Path):
        model_dir = Path(model_dir)
        index = model_dir / "model.safetensors.index.json"
        if index.is_file():
            with open(index) as f:
                weight_map: dict[str, str] = json.load(f)["weight_map"]
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in model_dir.glob("*.safetensors"))
            if not files:
                raise ConfigError(f"{model_dir} has no *.safetensors files")
            weight_map = {}
        self._handles = {}
        for name in files:
            path = model_dir / name
            if not path.is_file():
                raise ConfigError(f"{path} is listed in the checkpoint index but missing")
            read_header(path)  # a damaged file fails here with its name, not deep inside safe_open
            try:
                handle = safe_open(str(path), framework="pt")
            except SafetensorError as e:
                raise ConfigError(f"{path} is not a valid safetensors file ({e}); re-download or re-convert the "
                                  "checkpoint") from None
            self._handles[name] = handle
            for key in handle.keys():
                weight_map.setdefault(key, name)
        self._file_of = weight_map
        self.model_dir = model_dir

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def names(self) -> list[str]:
        return list(self._file_of)

    def raw(self, name: str) -> torch.Tensor:
        """The tensor as stored (dtype and shape of the file)."""
        if name not in self._file_of:
            raise ConfigError(f"checkpoint in {self.model_dir} lacks tensor {name!r}")
        return self._handles[self._file_of[name]].get_tensor(name)


class GGUFTensors(NamedTensors):
    """A GGUF file's tensors under their Hugging Face names, each converted when it is asked for, to what
    `shrike convert` would have written (bf16): a file run from its own blocks asks only for the tensors
    without a kernel (the norms; the embedding table and lm_head only when their types have none, or for
    --lm-head-quant int8), so no bf16 copy of the whole model is ever written."""

    def __init__(self, model: GGUFModel):
        self._converter = model.converter
        self._source = {name: tensor for tensor in model.reader.tensors for name in model.converter.names(tensor)}
        model.converter.check_complete(self._source)
        self.model_dir = model.path
        self._pending: dict[str, torch.Tensor] = {}  # converted but not yet asked for: a merged tensor's experts

    def __contains__(self, name: str) -> bool:
        return name in self._source

    def names(self) -> list[str]:
        return list(self._source)

    def stored_bytes(self) -> dict[str, int]:
        """Name -> the bytes the file stores it in (a merged tensor's shared evenly among its experts)."""
        parts = Counter(tensor.name for tensor in self._source.values())
        return {name: int(tensor.n_bytes) // parts[tensor.name] for name, tensor in self._source.items()}

    def raw(self, name: str) -> torch.Tensor:
        if name not in self._source:
            raise ConfigError(f"{self.model_dir} lacks tensor {name!r}")
        if name not in self._pending:
            self._pending = self._converter.convert(self._source[name])
        return self._pending.pop(name)
