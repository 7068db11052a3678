"""Calls written as JSON objects {"name": ..., "<arguments key>": {...}}, the shape most formats share."""
from __future__ import annotations

from shrike.server.tools.base import PartialCall, ToolCall, arguments_json
from shrike.server.tools.partial_json import scan_object, skip_whitespace

ARGUMENT_KEYS = ("arguments", "parameters")


def call_from_object(text: str, pos: int) -> tuple[ToolCall, int]:
    """The complete call object at text[pos] -> (call, index past it). ValueError if malformed or unfinished."""
    scan = scan_object(text, pos)
    if scan.end is None:
        raise ValueError("the tool call object is unfinished")
    name = scan.complete_value(text, "name")
    key = next((k for k in ARGUMENT_KEYS if k in scan.members), None)
    if not isinstance(name, str) or not name:
        raise ValueError("the tool call has no name")
    arguments = scan.complete_value(text, key) if key else {}
    return ToolCall(name, arguments_json(arguments)), scan.end


def partial_call_from_object(text: str, pos: int) -> tuple[PartialCall | None, int | None]:
    """The possibly unfinished call object at text[pos] -> (call so far or None, index past it once complete)."""
    scan = scan_object(text, pos)
    name = scan.complete_value(text, "name")
    if name is not None and not isinstance(name, str):
        raise ValueError("the tool call name is not a string")
    key = next((k for k in ARGUMENT_KEYS if k in scan.members), None)
    arguments = (scan.value_text(text, key) or "") if key else ""
    if arguments and skip_whitespace(arguments, 0) < len(arguments) and arguments.lstrip()[0] != "{":
        raise ValueError("tool call arguments must be a JSON object")
    if scan.end is not None and key is None:
        arguments = "{}"
    return (PartialCall(name, arguments) if name else None), scan.end


def partial_calls_from_list(text: str, pos: int) -> list[PartialCall]:
    """The calls so far of a possibly unfinished JSON list of call objects whose "[" is at text[pos]."""
    calls, i = [], pos + 1
    while True:
        i = skip_whitespace(text, i)
        if i >= len(text) or text[i] == "]":
            return calls
        if text[i] == ",":
            i += 1
            continue
        call, end = partial_call_from_object(text, i)
        if call is not None:
            calls.append(call)
        if end is None:
            return calls
        i = end
