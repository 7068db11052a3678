"""One Prometheus exposition out of every replica's: each sample gains a `replica` label.

The text format wants each family's samples together under one HELP/TYPE header, so samples
are regrouped by family rather than the replicas' texts being concatenated.
"""
from __future__ import annotations

import re

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def merge_expositions(texts: dict[str, str], label: str = "replica") -> str:
    headers: dict[str, list[str]] = {}  # family -> its HELP/TYPE lines, in first-seen order
    samples: dict[str, list[str]] = {}
    for value, text in texts.items():
        family = ""
        for line in text.splitlines():
            if line.startswith("#"):
                parts = line.split(maxsplit=3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = parts[2]
                    known = headers.setdefault(family, [])
                    if not any(h.split(maxsplit=2)[1] == parts[1] for h in known):
                        known.append(line)
                    samples.setdefault(family, [])
                continue
            if line.strip():
                samples.setdefault(family, []).append(_with_label(line, label, value))
    out: list[str] = []
    for family, lines in samples.items():
        out.extend(headers.get(family, []))
        out.extend(lines)
    return "\n".join(out) + "\n"


def _with_label(line: str, label: str, value: str) -> str:
    name = _NAME.match(line)
    if name is None:
        return line
    rest = line[name.end():]
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    if rest.startswith("{}"):
        rest = rest[2:]
    if rest.startswith("{"):
        return f'{name.group()}{{{label}="{escaped}",{rest[1:]}'
    return f'{name.group()}{{{label}="{escaped}"}}{rest}'
