"""What Shrike can run: model architectures, quantization schemes, kernel ops and tool-call parsers, by name.

Every name may have several implementations; one priority order picks among them:

1. ``plugin`` - registered by an installed plugin (see ``shrike.plugins``),
2. ``builtin:<isa>`` - Shrike's compiled kernel for the instruction set in use
   (``builtin`` alone for architectures and schemes that ship with Shrike),
3. ``reference`` - the plain torch implementation every kernel is tested against.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shrike.errors import ConfigError

SOURCE_PRIORITY = ("plugin", "builtin", "reference")
KINDS = ("architecture", "quantization", "op", "tool_parser")


@dataclass(frozen=True)
class Implementation:
    target: Any  # a model class or factory, a quantization scheme class, or an op's function
    source: str
    provider: str  # "shrike", or the plugin that registered it

    @property
    def rank(self) -> int:
        return SOURCE_PRIORITY.index(self.source.partition(":")[0])

    def describe(self) -> dict[str, str]:
        return {"source": self.source, "provider": self.provider}


class OpTable:
    """The implementation of every kernel op, chosen once at load; ``table.rmsnorm(...)`` calls it."""

    def __init__(self, chosen: dict[str, Implementation]) -> None:
        self.chosen = chosen
        for name, implementation in chosen.items():
            setattr(self, name, implementation.target)

    def is_builtin(self, name: str) -> bool:
        return self.chosen[name].source.startswith("builtin")

    def describe(self) -> dict[str, str]:
        return {name: f"{impl.source} ({impl.provider})" for name, impl in sorted(self.chosen.items())}


class Registry:
    def __init__(self) -> None:
        self._tables: dict[str, dict[str, list[Implementation]]] = {kind: {} for kind in KINDS}
        self.plugins: list[str] = []  # plugins whose register() ran, in order

    def _add(self, kind: str, name: str, implementation: Implementation) -> None:
        if implementation.source.partition(":")[0] not in SOURCE_PRIORITY:
            raise ValueError(f"unknown source {implementation.source!r}; use one of {', '.join(SOURCE_PRIORITY)}")
        entries = self._tables[kind].setdefault(name, [])
        for existing in entries:
            if existing.rank == implementation.rank:
                hint = "; choose one with SHRIKE_PLUGINS" if implementation.source == "plugin" else ""
                raise ConfigError(
                    f"{kind} {name!r} is registered by both {existing.provider} and {implementation.provider}{hint}"
                )
        entries.append(implementation)
        entries.sort(key=lambda entry: entry.rank)

    def register_architecture(self, name: str, factory: Callable, source: str = "builtin", provider: str = "shrike"):
        self._add("architecture", name, Implementation(factory, source, provider))

    def register_quantization(self, name: str, scheme: type, source: str = "builtin", provider: str = "shrike"):
        self._add("quantization", name, Implementation(scheme, source, provider))

    def register_op(self, op: str, fn: Callable, source: str, provider: str = "shrike"):
        self._add("op", op, Implementation(fn, source, provider))

    def register_tool_parser(self, name: str, parser: type, source: str = "builtin", provider: str = "shrike"):
        self._add("tool_parser", name, Implementation(parser, source, provider))

    def check_ops(self) -> None:
        """A plugin may only replace an op Shrike has: an unknown name is most likely a typo."""
        known = sorted(name for name, entries in self._tables["op"].items() if any(e.source != "plugin" for e in entries))
        for name, entries in sorted(self._tables["op"].items()):
            if name not in known:
                raise ConfigError(
                    f"plugin {entries[0].provider} registers op {name!r}, which does not exist; "
                    f"known ops: {', '.join(known)}"
                )

    def op_table(self, kernel_backend: str = "auto") -> "OpTable":
        """Every op resolved once. kernel_backend "reference" skips the built-in kernels, so every
        op a plugin does not replace runs its torch reference."""
        self.check_ops()
        chosen = {}
        for name, entries in self._tables["op"].items():
            usable = [e for e in entries if kernel_backend != "reference" or not e.source.startswith("builtin")]
            chosen[name] = usable[0]
        return OpTable(chosen)

    def _resolve_user_choice(self, kind: str, name: str, what: str) -> Implementation:
        entries = self._tables[kind].get(name)
        if not entries:
            known = ", ".join(sorted(self._tables[kind])) or "none"
            raise ConfigError(
                f"{what} {name!r} is not supported (supported: {known}); install a plugin that provides it"
            )
        return entries[0]

    def architecture(self, name: str) -> Implementation:
        return self._resolve_user_choice("architecture", name, "model architecture")

    def quantization(self, name: str) -> Implementation:
        return self._resolve_user_choice("quantization", name, "quantization scheme")

    def tool_parser(self, name: str) -> Implementation:
        return self._resolve_user_choice("tool_parser", name, "tool call parser")

    def describe(self) -> dict[str, Any]:
        """For each kind and name: the implementation chosen and every candidate, best first."""
        return {
            "plugins": list(self.plugins),
            **{
                kind: {
                    name: {**entries[0].describe(), "candidates": [entry.describe() for entry in entries]}
                    for name, entries in sorted(table.items())
                }
                for kind, table in self._tables.items()
            },
        }
