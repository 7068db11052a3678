"""Reading a JSON object that is still being written: which members are complete, where each value lies.

Streamed tool calls send a call's name once it is complete and its arguments as raw text as it grows,
so the concatenated argument deltas are exactly the JSON text the model wrote.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

_WHITESPACE = " \t\n\r"
_LITERAL_CHARS = set("0123456789+-.eEtruefalsn")


@dataclass
class ObjectScan:
    # member name -> (start, end) of its value text; end None while the value is unfinished
    members: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    end: int | None = None  # just past the closing brace, once the object is complete

    def value_text(self, text: str, key: str) -> str | None:
        """The raw text of a member's value so far (possibly unfinished), or None if the member has not begun."""
        if key not in self.members:
            return None
        start, end = self.members[key]
        return text[start:] if end is None else text[start:end]

    def complete_value(self, text: str, key: str):
        """A member's value, decoded, once it is complete; None before."""
        if key not in self.members or self.members[key][1] is None:
            return None
        start, end = self.members[key]
        return json.loads(text[start:end])


def skip_whitespace(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WHITESPACE:
        pos += 1
    return pos


def scan_object(text: str, pos: int = 0) -> ObjectScan:
    """The object starting at text[pos] (after optional whitespace). Raise ValueError if it is not one."""
    scan = ObjectScan()
    i = skip_whitespace(text, pos)
    if i >= len(text):
        return scan
    if text[i] != "{":
        raise ValueError(f"expected an object at {i}")
    i += 1
    while True:
        i = skip_whitespace(text, i)
        if i >= len(text):
            return scan
        if text[i] == "}":
            scan.end = i + 1
            return scan
        if text[i] == ",":
            i += 1
            continue
        if text[i] != '"':
            raise ValueError(f"expected a member name at {i}")
        key_end = value_end(text, i)
        if key_end is None:
            return scan
        key = json.loads(text[i:key_end])
        i = skip_whitespace(text, key_end)
        if i >= len(text):
            return scan
        if text[i] != ":":
            raise ValueError(f"expected ':' at {i}")
        i = skip_whitespace(text, i + 1)
        if i >= len(text):
            return scan
        end = value_end(text, i)
        scan.members[key] = (i, end)
        if end is None:
            return scan
        i = end


def value_end(text: str, pos: int) -> int | None:
    """Index just past the JSON value starting at text[pos]; None if the text ends first. ValueError if malformed."""
    first = text[pos]
    if first == '"':
        i = pos + 1
        while i < len(text):
            if text[i] == "\\":
                i += 2
                continue
            if text[i] == '"':
                return i + 1
            i += 1
        return None
    if first in "{[":
        depth, i, in_string = 0, pos, False
        while i < len(text):
            c = text[i]
            if in_string:
                if c == "\\":
                    i += 1
                elif c == '"':
                    in_string = False
            elif c == '"':
                in_string = True
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return None
    if first in _LITERAL_CHARS:
        i = pos
        while i < len(text) and text[i] in _LITERAL_CHARS:
            i += 1
        return i if i < len(text) else None  # a number may still grow
    raise ValueError(f"unexpected {first!r} at {pos}")
