"""Which cores Shrike computes on by default, and how --cpu-threads / --cpu-bind change that.

On a big.LITTLE machine (a CIX P1: eight Cortex-A720 and four Cortex-A520) a thread on a little
core finishes its share of every matrix product last and the whole step waits for it, so by
default only the fastest class of cores is used. Within the cores this process may run on
(affinity mask and cgroup cpuset), that class is found from the first of these that splits the
cores into clearly different speeds: the scheduler's cpu_capacity, cpufreq's maximum frequency,
then the core type from /proc/cpuinfo.
"""

import math
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from shrike.errors import ConfigError
from shrike.platform.cgroup import CgroupLimits, read_cgroup_limits
from shrike.platform.cpuinfo import CoreKind, read_core_kinds
from shrike.platform.cpulist import format_cpu_list, parse_cpu_list

__all__ = ["Core", "Topology", "format_cpu_list", "parse_cpu_list", "read_topology", "resolve_binding"]

# Speeds within this ratio of each other are one class: turbo bins and favoured cores differ by a
# few percent, big and little cores by 2x or more.
SAME_CLASS_RATIO = 0.8


@dataclass(frozen=True)
class Core:
    id: int
    online: bool
    allowed: bool  # in this process's affinity mask and its cgroup's cpuset
    kind: CoreKind | None
    capacity: int | None
    max_freq_khz: int | None


@dataclass(frozen=True)
class Topology:
    cores: tuple[Core, ...]
    affinity: tuple[int, ...]
    cgroup: CgroupLimits

    def core(self, core_id: int) -> Core:
        return next(core for core in self.cores if core.id == core_id)

    @property
    def usable(self) -> list[int]:
        return [core.id for core in self.cores if core.online and core.allowed]

    @property
    def cpu_model(self) -> str:
        counts: dict[str, int] = {}
        for core in self.cores:
            if core.kind:
                counts[core.kind.name] = counts.get(core.kind.name, 0) + 1
        if len(counts) == 1:
            return next(iter(counts))
        return " + ".join(f"{count}x {name}" for name, count in counts.items()) or "unknown"

    @property
    def quota_cores(self) -> int | None:
        """Whole cores the cgroup's CPU quota pays for; more threads would be throttled."""
        quota = self.cgroup.cpu_quota_cores
        return None if quota is None else max(1, math.floor(quota))

    def fastest_first(self, core_ids: Iterable[int]) -> list[int]:
        def speed(core: Core) -> tuple:
            tier = 0 if core.kind and core.kind.efficiency else 1
            return (-(core.capacity or 0), -(core.max_freq_khz or 0), -tier, core.id)

        return [core.id for core in sorted((self.core(i) for i in core_ids), key=speed)]

    def speed_classes(self, core_ids: Collection[int]) -> tuple[str | None, list[int]]:
        """The basis that tells fast from slow cores among ``core_ids`` and the fastest class.

        The basis is None when the cores are one class.
        """
        cores = [self.core(i) for i in core_ids]
        measures = {
            "cpu_capacity": lambda core: core.capacity,
            "max frequency": lambda core: core.max_freq_khz,
            "core type": lambda core: None if core.kind is None else (1 if core.kind.efficiency else 2),
        }
        for basis, measure in measures.items():
            speeds = [measure(core) for core in cores]
            if None in speeds or not speeds:
                continue
            threshold = _class_threshold(speeds)
            if threshold is not None:
                return basis, sorted(core.id for core, speed in zip(cores, speeds) if speed >= threshold)
        return None, sorted(core_ids)

    @property
    def default_cores(self) -> list[int]:
        _, fastest = self.speed_classes(self.usable)
        if self.quota_cores is not None:
            fastest = sorted(self.fastest_first(fastest)[: self.quota_cores])
        return fastest


def _class_threshold(speeds: list[int]) -> int | None:
    """Slowest speed of the fastest class, if the widest gap between speeds separates classes."""
    distinct = sorted(set(speeds), reverse=True)
    ratios = [(slower / faster, faster) for faster, slower in zip(distinct, distinct[1:])]
    ratio, faster = min(ratios, default=(1.0, None))
    return faster if ratio < SAME_CLASS_RATIO else None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _read_cpu_list(path: Path) -> list[int] | None:
    try:
        return parse_cpu_list(path.read_text())
    except OSError:
        return None


def _read_affinity(procfs_root: Path) -> list[int]:
    try:
        status = (procfs_root / "self" / "status").read_text()
    except OSError:
        return sorted(os.sched_getaffinity(0))
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key == "Cpus_allowed_list":
            return parse_cpu_list(value)
    return sorted(os.sched_getaffinity(0))


def read_topology(
    sysfs_root: str | Path = "/sys",
    procfs_root: str | Path = "/proc",
    affinity: Collection[int] | None = None,
) -> Topology:
    """Cores as the kernel describes them; ``affinity`` defaults to this process's mask."""
    cpu_dir = Path(sysfs_root) / "devices" / "system" / "cpu"
    present = _read_cpu_list(cpu_dir / "present") or sorted(
        int(d.name[3:]) for d in cpu_dir.glob("cpu[0-9]*") if d.name[3:].isdigit()
    )
    online = set(_read_cpu_list(cpu_dir / "online") or present)
    allowed_mask = sorted(affinity) if affinity is not None else _read_affinity(Path(procfs_root))
    cgroup = read_cgroup_limits(sysfs_root, procfs_root)
    allowed = set(allowed_mask) & set(cgroup.cpuset if cgroup.cpuset is not None else present)
    kinds = read_core_kinds(procfs_root)
    cores = tuple(
        Core(
            id=i,
            online=i in online,
            allowed=i in allowed,
            kind=kinds.get(i),
            capacity=_read_int(cpu_dir / f"cpu{i}" / "cpu_capacity"),
            max_freq_khz=_read_int(cpu_dir / f"cpu{i}" / "cpufreq" / "cpuinfo_max_freq"),
        )
        for i in present
    )
    return Topology(cores=cores, affinity=tuple(allowed_mask), cgroup=cgroup)


def _bind_list(cpu_bind: str, topology: Topology) -> list[int]:
    try:
        requested = parse_cpu_list(cpu_bind)
    except ConfigError as error:
        raise ConfigError(f"--cpu-bind: {error}") from None
    if not requested:
        raise ConfigError("--cpu-bind is empty; give cores like 0,1,6-11, or leave it out to use the fastest cores")
    present = {core.id for core in topology.cores}
    problems = [
        ([i for i in requested if i not in present], f"do not exist (this machine has cores {format_cpu_list(present)})"),
        (
            [i for i in requested if i in present and not topology.core(i).online],
            f"are offline (online: {format_cpu_list(c.id for c in topology.cores if c.online)})",
        ),
        (
            [i for i in requested if i in present and topology.core(i).online and not topology.core(i).allowed],
            f"are outside the cores this process may use ({format_cpu_list(topology.usable)}, "
            "from its affinity mask and cgroup cpuset)",
        ),
    ]
    for cores, reason in problems:
        if cores:
            raise ConfigError(f"--cpu-bind {cpu_bind}: cores {format_cpu_list(cores)} {reason}")
    return requested


def resolve_binding(cpu_threads: int | None, cpu_bind: str | None, topology: Topology) -> list[int]:
    """Cores to run compute threads on, one thread per core.

    Neither flag: the default cores. ``cpu_bind``: exactly those cores. ``cpu_threads``: that many
    cores, fastest first, from ``cpu_bind`` if given, else from every core this process may use.
    """
    if cpu_bind is not None:
        candidates = _bind_list(cpu_bind, topology)
    elif cpu_threads is None:
        if not topology.default_cores:
            raise ConfigError(
                "no usable CPU cores: none of the online cores is in this process's affinity mask and cgroup cpuset"
            )
        return topology.default_cores
    else:
        candidates = topology.usable
    if cpu_threads is None:
        return candidates
    if cpu_threads < 1:
        raise ConfigError(f"--cpu-threads {cpu_threads}: give at least 1")
    if cpu_threads > len(candidates):
        where = f"--cpu-bind {cpu_bind} lists" if cpu_bind is not None else "this process may use"
        raise ConfigError(
            f"--cpu-threads {cpu_threads} is more than the {len(candidates)} cores {where} "
            f"({format_cpu_list(candidates)}); lower it"
        )
    return sorted(topology.fastest_first(candidates)[:cpu_threads])
