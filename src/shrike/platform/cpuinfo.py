"""What kind each core is, from /proc/cpuinfo: the Arm part ("CPU part") or the x86 "model name"."""

from dataclasses import dataclass
from pathlib import Path

ARM_LTD = "0x41"

# Arm Ltd part numbers (MIDR_EL1 bits 15:4) of the application cores Linux servers and boards ship.
ARM_PART_NAMES = {
    "0xd03": "Cortex-A53", "0xd04": "Cortex-A35", "0xd05": "Cortex-A55", "0xd07": "Cortex-A57",
    "0xd08": "Cortex-A72", "0xd09": "Cortex-A73", "0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76",
    "0xd0c": "Neoverse-N1", "0xd0d": "Cortex-A77", "0xd40": "Neoverse-V1", "0xd41": "Cortex-A78",
    "0xd44": "Cortex-X1", "0xd46": "Cortex-A510", "0xd47": "Cortex-A710", "0xd48": "Cortex-X2",
    "0xd49": "Neoverse-N2", "0xd4b": "Cortex-A78C", "0xd4c": "Cortex-X1C", "0xd4d": "Cortex-A715",
    "0xd4e": "Cortex-X3", "0xd4f": "Neoverse-V2", "0xd80": "Cortex-A520", "0xd81": "Cortex-A720",
    "0xd82": "Cortex-X4", "0xd84": "Neoverse-V3", "0xd85": "Cortex-X925", "0xd87": "Cortex-A725",
    "0xd8a": "C1-Nano", "0xd8b": "C1-Pro", "0xd8c": "C1-Ultra", "0xd8e": "Neoverse-N3",
    "0xd8f": "Cortex-A320", "0xd90": "C1-Premium",
}

# In-order "LITTLE" designs: a fraction of a big core's throughput, so never worth a compute thread
# next to big cores.
ARM_EFFICIENCY_PARTS = frozenset({"0xd03", "0xd04", "0xd05", "0xd46", "0xd80", "0xd8a", "0xd8f"})


@dataclass(frozen=True)
class CoreKind:
    name: str
    arm_part: str | None = None
    efficiency: bool = False

    @property
    def label(self) -> str:
        return f"{self.name} ({self.arm_part})" if self.arm_part else self.name


def _arm_kind(implementer: str, part: str) -> CoreKind:
    implementer, part = implementer.lower(), part.lower()
    if implementer == ARM_LTD and part in ARM_PART_NAMES:
        return CoreKind(ARM_PART_NAMES[part], part, part in ARM_EFFICIENCY_PARTS)
    return CoreKind(f"unknown core of implementer {implementer}", part)


def parse_cpuinfo(text: str) -> dict[int, CoreKind]:
    """Kind of each processor listed in a /proc/cpuinfo text (only online cores are listed)."""
    kinds: dict[int, CoreKind] = {}
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if not fields.get("processor", "").isdigit():
            continue
        core = int(fields["processor"])
        if "model name" in fields:
            kinds[core] = CoreKind(fields["model name"])
        elif "CPU part" in fields:
            kinds[core] = _arm_kind(fields.get("CPU implementer", "?"), fields["CPU part"])
    return kinds


def read_core_kinds(procfs_root: str | Path = "/proc") -> dict[int, CoreKind]:
    try:
        return parse_cpuinfo((Path(procfs_root) / "cpuinfo").read_text())
    except OSError:
        return {}
