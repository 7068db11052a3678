"""Named tensors of a checkpoint spread over one or more memory-mapped safetensors files."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from shrike.errors import ConfigError
from shrike.quantization.safetensors_io import read_header


class CheckpointTensors:
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

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        t = self.raw(name)
        if tuple(t.shape) != tuple(shape):
            raise ConfigError(f"tensor {name!r} has shape {tuple(t.shape)} but config.json implies {tuple(shape)}")
        return t.to(dtype)
