"""The KV-cache element types `--kv-cache-dtype` names, and what each costs: the one place these facts live."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from shrike.errors import ConfigError
from shrike import kv_int8


@dataclass(frozen=True)
class KVElement:
    dtype: torch.dtype  # the cache tensors' dtype
    value_bytes: int  # per cached key or value element
    scale_bytes: int  # per (token, KV head) row: int8 rows carry their float32 scale


KV_ELEMENTS = {
    "bfloat16": KVElement(torch.bfloat16, 2, 0),
    "float32": KVElement(torch.float32, 4, 0),
    "int8": KVElement(torch.int8, 1, kv_int8.SCALE_BYTES),
}
KV_CACHE_DTYPES = ("auto", *KV_ELEMENTS)  # auto: the activations' dtype


def resolve_kv_cache_dtype(name: str, act_dtype: torch.dtype) -> torch.dtype:
    """--kv-cache-dtype -> the cache tensors' dtype (torch.int8: int8 rows with per-row scales)."""
    if name == "auto":
        return act_dtype
    if name not in KV_ELEMENTS:
        raise ConfigError(f"--kv-cache-dtype {name!r} is not supported; use {', '.join(KV_CACHE_DTYPES)} "
                          "(int8 halves the cache of a bfloat16 model)")
    return KV_ELEMENTS[name].dtype


def kv_element(kv_dtype: torch.dtype) -> KVElement:
    for element in KV_ELEMENTS.values():
        if element.dtype == kv_dtype:
            return element
    raise ValueError(f"no KV cache holds {kv_dtype}; the cache dtypes are {', '.join(KV_ELEMENTS)}")


def kv_cache_bytes(kv_dtype: torch.dtype) -> tuple[int, int]:
    """(bytes per cached value, bytes of scale per token and KV head) of a cache dtype."""
    element = kv_element(kv_dtype)
    return element.value_bytes, element.scale_bytes
