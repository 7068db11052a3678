"""Memory Shrike may use, and how much of it the KV cache gets.

The cache is sized from memory that is actually available (MemAvailable, or the cgroup's headroom
when that is lower), never from a fraction of total memory: on a machine that also runs other
things a total-memory rule either refuses to start or overcommits.
"""

import ctypes
import ctypes.util
import math
from dataclasses import dataclass
from pathlib import Path

from shrike.errors import ConfigError
from shrike.platform.cgroup import read_cgroup_limits

GIB = 1 << 30
# Share of the memory left after weights and the runtime reserve that the KV cache takes; the rest
# absorbs allocator fragmentation and other processes' growth while the server runs.
AUTO_KV_FRACTION = 0.9
# Activations, the tokenizer, Python and torch themselves.
RUNTIME_RESERVE_BYTES = 1 * GIB


@dataclass(frozen=True)
class MemoryInfo:
    total_bytes: int
    available_bytes: int  # what a new allocation can get: MemAvailable, capped by the cgroup
    host_available_bytes: int  # MemAvailable
    cgroup_limit_bytes: int | None


def _meminfo(procfs_root: Path) -> dict[str, int]:
    values = {}
    for line in (procfs_root / "meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        values[key] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return values


def read_memory(sysfs_root: str | Path = "/sys", procfs_root: str | Path = "/proc") -> MemoryInfo:
    meminfo = _meminfo(Path(procfs_root))
    cgroup = read_cgroup_limits(sysfs_root, procfs_root)
    available = meminfo["MemAvailable"]
    if cgroup.memory_headroom_bytes is not None:
        available = min(available, cgroup.memory_headroom_bytes)
    return MemoryInfo(
        total_bytes=meminfo["MemTotal"],
        available_bytes=available,
        host_available_bytes=meminfo["MemAvailable"],
        cgroup_limit_bytes=cgroup.memory_limit_bytes,
    )


@dataclass(frozen=True)
class KVCachePlan:
    bytes_per_token: int
    block_size: int
    num_blocks: int
    capacity_tokens: int
    cache_bytes: int
    max_concurrent_full_sequences: int
    source: str  # "flag" (--kv-cache-space) or "auto"
    reason: str


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.1f} GiB"


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, kv_dtype_bytes: int,
                       kv_scale_bytes: int = 0) -> int:
    """Cache bytes one token takes: keys and values; an int8 cache also keeps a scale per token and KV head."""
    return 2 * num_layers * num_kv_heads * (head_dim * kv_dtype_bytes + kv_scale_bytes)


def plan_kv_cache(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    kv_dtype_bytes: int,
    block_size: int,
    max_model_len: int,
    weight_bytes: int,
    kv_cache_space_gib: float | None = None,
    available_bytes: int | None = None,
    max_num_seqs: int | None = None,
    runtime_reserve_bytes: int = RUNTIME_RESERVE_BYTES,
    kv_scale_bytes: int = 0,
) -> KVCachePlan:
    """Size the paged KV cache.

    ``available_bytes`` is memory available before the weights are loaded (default: measured now).
    With ``kv_cache_space_gib`` the cache is that size, if it fits; otherwise it is
    ``AUTO_KV_FRACTION`` of what remains after the weights and ``runtime_reserve_bytes``, but no
    more than ``max_num_seqs`` sequences of ``max_model_len`` tokens can use.
    """
    for name, value in [("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                        ("kv_dtype_bytes", kv_dtype_bytes), ("block_size", block_size)]:
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    if max_num_seqs is not None and max_num_seqs < 1:
        raise ConfigError(f"--max-num-seqs {max_num_seqs}: give at least 1")
    if max_model_len < 1:
        raise ConfigError(f"--max-model-len {max_model_len}: give at least 1 token")
    if kv_cache_space_gib is not None and kv_cache_space_gib <= 0:
        raise ConfigError(f"--kv-cache-space {kv_cache_space_gib}: give a size in GiB above 0, or leave it out")
    if available_bytes is None:
        available_bytes = read_memory().available_bytes

    bytes_per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, kv_dtype_bytes, kv_scale_bytes)
    after_weights = available_bytes - weight_bytes - runtime_reserve_bytes
    if kv_cache_space_gib is not None:
        source, budget = "flag", int(kv_cache_space_gib * GIB)
        if budget > after_weights:
            raise ConfigError(
                f"--kv-cache-space {kv_cache_space_gib:g} GiB does not fit: {_gib(available_bytes)} is available, "
                f"the weights take {_gib(weight_bytes)} and the runtime {_gib(runtime_reserve_bytes)}, leaving "
                f"{_gib(max(after_weights, 0))}; lower --kv-cache-space or free memory"
            )
        reason = f"--kv-cache-space {kv_cache_space_gib:g} GiB"
    else:
        source, budget = "auto", int(max(after_weights, 0) * AUTO_KV_FRACTION)
        reason = (
            f"{AUTO_KV_FRACTION:.0%} of the {_gib(max(after_weights, 0))} left from {_gib(available_bytes)} available "
            f"after {_gib(weight_bytes)} of weights and a {_gib(runtime_reserve_bytes)} runtime reserve"
        )

    block_bytes = bytes_per_token * block_size
    num_blocks = budget // block_bytes
    blocks_per_sequence = math.ceil(max_model_len / block_size)
    if source == "auto" and max_num_seqs is not None and num_blocks > max_num_seqs * blocks_per_sequence:
        num_blocks = max_num_seqs * blocks_per_sequence
        reason = (
            f"room for max_num_seqs={max_num_seqs} sequences of {max_model_len} tokens, all a server runs at once "
            f"(memory would allow more: {reason})"
        )
    full_sequences = num_blocks // blocks_per_sequence
    if full_sequences == 0:
        needed = blocks_per_sequence * block_bytes
        remedy = f"raise --kv-cache-space to at least {math.ceil(needed / GIB * 10) / 10:g} GiB" if source == "flag" else (
            "free memory"
        )
        if num_blocks == 0:
            raise ConfigError(f"no memory is left for the KV cache ({reason}); {remedy}")
        fits = num_blocks * block_size
        raise ConfigError(
            f"the KV cache ({reason}) holds {fits} tokens, but one --max-model-len {max_model_len} sequence needs "
            f"{_gib(needed)}; lower --max-model-len to at most {fits} or {remedy}"
        )
    return KVCachePlan(
        bytes_per_token=bytes_per_token,
        block_size=block_size,
        num_blocks=num_blocks,
        capacity_tokens=num_blocks * block_size,
        cache_bytes=num_blocks * block_bytes,
        max_concurrent_full_sequences=full_sequences,
        source=source,
        reason=reason,
    )


def _glibc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _glibc()


def return_freed_memory() -> None:
    """Give freed heap memory back to the OS.

    glibc serves buffers below its (adaptive, up to 32 MiB) mmap threshold from the heap and keeps
    them after free, so loading a model would otherwise end with every layer's temporaries resident.
    """
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


class FreedMemory:
    """Counts the bytes of loading buffers as they are freed and returns them to the OS every `every_bytes`:
    trimming walks the heap and later buffers fault in fresh pages, so often enough to bound what stays
    resident after a cold start, rarely enough to cost little."""

    def __init__(self, every_bytes: int = 128 << 20):
        self.every_bytes, self.pending = every_bytes, 0

    def freed(self, nbytes: int) -> None:
        self.pending += nbytes
        if self.pending >= self.every_bytes:
            return_freed_memory()
            self.pending = 0
