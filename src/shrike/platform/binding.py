"""Puts compute threads on the chosen cores: PyTorch's pool and the kernel core's pool."""
from __future__ import annotations

import os

import torch

from shrike import kernels
from shrike.platform.cpulist import format_cpu_list
from shrike.platform.topology import read_topology, resolve_binding


def bind_compute_threads(cpu_threads: int | None = None, cpu_bind: str | None = None) -> list[int]:
    """Default: the fastest class of usable cores (all of them on a homogeneous machine)."""
    cores = resolve_binding(cpu_threads, cpu_bind, read_topology())
    # The process mask first, so that threads PyTorch creates later inherit it.
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))
    kernels.set_threads(len(cores), cpu_bind=format_cpu_list(cores))
    return cores
