"""The kernel's CPU list syntax ("0,1,6-11"), used by sysfs, cgroups and --cpu-bind."""

import re
from collections.abc import Iterable

from shrike.errors import ConfigError

# Linux numbers at most 8192 CPUs (NR_CPUS); the bound keeps a typo like 0-99999999 from filling memory.
MAX_CPU_ID = 65535
_EXPECTED = "expected core numbers and ranges separated by commas, like 0,1,6-11"


def parse_cpu_list(text: str) -> list[int]:
    """Core ids in ``text``, sorted and without duplicates; an empty or blank string is no cores."""
    if not text.strip():
        return []
    cores: set[int] = set()
    for item in text.strip().split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", item, re.ASCII)
        if match is None:
            raise ConfigError(f"invalid CPU list {text!r}: {item.strip()!r} is not a core number or range; {_EXPECTED}")
        low = int(match[1])
        high = int(match[2]) if match[2] else low
        if high < low:
            raise ConfigError(f"invalid CPU list {text!r}: range {item.strip()!r} runs backwards; write it as {high}-{low}")
        if high > MAX_CPU_ID:
            raise ConfigError(f"invalid CPU list {text!r}: core {high} is beyond any machine's core numbers")
        cores.update(range(low, high + 1))
    return sorted(cores)


def format_cpu_list(cores: Iterable[int]) -> str:
    """The shortest kernel-style list for ``cores``: runs of three or more become ranges."""
    ordered = sorted(set(cores))
    parts: list[str] = []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        if end - start >= 2:
            parts.append(f"{ordered[start]}-{ordered[end]}")
        else:
            parts.extend(str(core) for core in ordered[start : end + 1])
        start = end + 1
    return ",".join(parts)
