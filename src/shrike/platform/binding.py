"""Puts compute threads on the chosen cores: PyTorch's pool and the kernel core's pool."""
from __future__ import annotations

import os

import torch

from shrike import OPENMP_WORKERS_SPIN, kernels
from shrike.platform.cpulist import format_cpu_list
from shrike.platform.topology import read_topology, resolve_binding


def bind_compute_threads(cpu_threads: int | None = None, cpu_bind: str | None = None) -> list[int]:
    """Default: the fastest class of usable cores (all of them on a homogeneous machine)."""
    cores = resolve_binding(cpu_threads, cpu_bind, read_topology())
    # The process mask first, so that threads PyTorch creates later inherit it.
    os.sched_setaffinity(0, cores)
    # Spinning OpenMP workers (shrike/__init__.py) would take the cores from the kernel core's pool: torch's own
    # ops, small beside the kernel core's, then run on the calling thread only.
    torch.set_num_threads(1 if OPENMP_WORKERS_SPIN else len(cores))
    kernels.set_threads(len(cores), cpu_bind=format_cpu_list(cores))
    return cores

