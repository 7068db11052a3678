"""Container limits on CPU and memory, from the process's cgroup (v2, or v1 controllers).

Hierarchies are looked for where systemd and container runtimes mount them: <sysfs>/fs/cgroup
(v2 alone), <sysfs>/fs/cgroup/unified (hybrid) and <sysfs>/fs/cgroup/<controller> (v1).
"""

from dataclasses import dataclass
from pathlib import Path

from shrike.platform.cpulist import parse_cpu_list

# v1 reports "no limit" as a page-rounded LONG_MAX; anything this large is no limit.
_UNLIMITED_BYTES = 1 << 60


@dataclass(frozen=True)
class CgroupLimits:
    cpu_quota_cores: float | None = None  # CPU time allowed per period, in cores
    cpuset: tuple[int, ...] | None = None
    memory_limit_bytes: int | None = None
    memory_in_use_bytes: int | None = None  # charged to the cgroup, less reclaimable file cache

    @property
    def memory_headroom_bytes(self) -> int | None:
        if self.memory_limit_bytes is None or self.memory_in_use_bytes is None:
            return None
        return max(0, self.memory_limit_bytes - self.memory_in_use_bytes)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _memberships(procfs_root: Path) -> dict[str, str]:
    """Controller name ("" for the v2 hierarchy) → the process's cgroup path in it."""
    memberships: dict[str, str] = {}
    for line in (_read(procfs_root / "self" / "cgroup") or "").splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            memberships[""] = path
        for controller in filter(None, controllers.split(",")):
            memberships[controller] = path
    return memberships


def _chain(mount: Path, path: str) -> list[Path]:
    """The cgroup's directory and its ancestors up to the mount, innermost first.

    Without a cgroup namespace a container sees its host path while its own cgroup is
    mounted at the root, so directories that do not exist are skipped.
    """
    leaf = mount / path.strip("/")
    return [d for d in (leaf, *leaf.parents) if d.is_dir() and d.is_relative_to(mount)]


def _v2_chain(sysfs_root: Path, memberships: dict[str, str]) -> list[Path]:
    if "" not in memberships:
        return []
    base = sysfs_root / "fs" / "cgroup"
    mount = base if (base / "cgroup.controllers").exists() else base / "unified"
    return _chain(mount, memberships[""])


def _v1_chain(sysfs_root: Path, memberships: dict[str, str], controller: str) -> list[Path]:
    if controller not in memberships:
        return []
    return _chain(sysfs_root / "fs" / "cgroup" / controller, memberships[controller])


def _cpu_quota(v2: list[Path], v1: list[Path]) -> float | None:
    quotas = []
    for directory in v2:
        quota, _, period = (_read(directory / "cpu.max") or "max").partition(" ")
        if quota != "max":
            quotas.append(int(quota) / int(period or 100000))
    for directory in v1:
        quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
        if quota and period and int(quota) > 0:
            quotas.append(int(quota) / int(period))
    return min(quotas, default=None)


def _cpuset(v2: list[Path], v1: list[Path]) -> tuple[int, ...] | None:
    # The innermost "effective" set already folds in every ancestor's restriction.
    for directory, name in [*((d, "cpuset.cpus.effective") for d in v2), *((d, "cpuset.effective_cpus") for d in v1)]:
        text = _read(directory / name)
        if text:
            return tuple(parse_cpu_list(text))
    return None


def _memory_stat(directory: Path, key: str) -> int:
    for line in (_read(directory / "memory.stat") or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def _memory_limit(chain: list[Path], name: str) -> int | None:
    limits = [int(text) for text in (_read(d / name) for d in chain) if text and text != "max"]
    return min((limit for limit in limits if limit < _UNLIMITED_BYTES), default=None)


def _memory(v2: list[Path], v1: list[Path]) -> tuple[int | None, int | None]:
    """The tightest memory limit and what the cgroup holding it has in use."""
    hierarchies = [
        (v2, _memory_limit(v2, "memory.max"), "memory.current", "inactive_file"),
        (v1, _memory_limit(v1, "memory.limit_in_bytes"), "memory.usage_in_bytes", "total_inactive_file"),
    ]
    limited = [h for h in hierarchies if h[1] is not None]
    if not limited:
        return None, None
    chain, limit, usage_file, inactive_key = min(limited, key=lambda h: h[1])
    usage = _read(chain[0] / usage_file)
    in_use = int(usage) - _memory_stat(chain[0], inactive_key) if usage else None
    return limit, in_use


def read_cgroup_limits(sysfs_root: str | Path = "/sys", procfs_root: str | Path = "/proc") -> CgroupLimits:
    sysfs_root, procfs_root = Path(sysfs_root), Path(procfs_root)
    memberships = _memberships(procfs_root)
    v2 = _v2_chain(sysfs_root, memberships)
    memory_limit, memory_in_use = _memory(v2, _v1_chain(sysfs_root, memberships, "memory"))
    return CgroupLimits(
        cpu_quota_cores=_cpu_quota(v2, _v1_chain(sysfs_root, memberships, "cpu")),
        cpuset=_cpuset(v2, _v1_chain(sysfs_root, memberships, "cpuset")),
        memory_limit_bytes=memory_limit,
        memory_in_use_bytes=memory_in_use,
    )
