"""Typed access to a GGUF file's key/value metadata."""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGUFReader


class GGUFMetadata:
    def __init__(self, reader: GGUFReader) -> None:
        self._fields = reader.fields
        self.architecture: str = self.require("general.architecture")

    def __contains__(self, key: str) -> bool:
        return key in self._fields

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str) -> Any:
        if key not in self._fields:
            raise ValueError(f"the GGUF file lacks the metadata key {key!r}, which conversion needs")
        return self.get(key)

    def arch_key(self, template: str) -> str:
        """Expand a gguf.Keys template such as '{arch}.context_length' for this file's architecture."""
        return template.format(arch=self.architecture)

    def keys_with_prefix(self, prefix: str) -> list[str]:
        return [key for key in self._fields if key.startswith(prefix)]


def float32_value(value: float) -> float:
    """GGUF stores floats as float32; print them as the short decimal that float32 round-trips (1e-05, not 9.99e-06)."""
    return float(str(np.float32(value)))
