"""Outputs forced by tool_choice: a named function's arguments, or (required) a JSON list of calls.

Both are generated under a JSON schema grammar, so they parse; they only fail to when cut off by max_tokens.
"""
from __future__ import annotations

import json

from shrike.server.tools.base import PARSE_ERRORS, PartialCall, ToolCall, ToolParser, arguments_json
from shrike.server.tools.json_calls import partial_calls_from_list
from shrike.server.tools.partial_json import scan_object, skip_whitespace


def required_schema(tools: list[dict], parallel: bool) -> dict:
    """[{"name": <a tool>, "parameters": <its arguments>}, ...] with at least one call."""
    options = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                                  "parameters": parameters_schema(t)},
                "required": ["name", "parameters"], "additionalProperties": False} for t in tools]
    schema = {"type": "array", "minItems": 1, "items": options[0] if len(options) == 1 else {"anyOf": options}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def parameters_schema(tool: dict) -> dict:
    return tool["function"].get("parameters") or {"type": "object", "properties": {}}


class _ForcedToolParser(ToolParser):
    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        content, calls = super().extract(text)
        if calls:
            return content, calls
        # Cut off by max_tokens: still the call the grammar forced, with the arguments written so far (as vLLM).
        try:
            partial = self.partial_calls(text)
        except PARSE_ERRORS:
            return text, []
        calls = [ToolCall(call.name, call.arguments) for call in partial if call.name is not None]
        return (None, calls) if calls else (text, [])


class NamedToolParser(_ForcedToolParser):
    """The whole output is the arguments of one known function."""

    def __init__(self, name: str):
        self.name = name

    def section_start(self, text: str) -> int | None:
        return 0

    def calls(self, section: str) -> list[ToolCall]:
        scan = scan_object(section)
        if scan.end is None or section[scan.end:].strip():
            raise ValueError("the arguments are not one JSON object")
        arguments_json(json.loads(section))  # checks it is an object
        return [ToolCall(self.name, section.strip())]

    def partial_calls(self, section: str) -> list[PartialCall]:
        return [PartialCall(self.name, section.lstrip())]


class RequiredToolParser(_ForcedToolParser):
    """The output is a JSON list of {"name", "parameters"} objects."""

    def section_start(self, text: str) -> int | None:
        return 0

    def calls(self, section: str) -> list[ToolCall]:
        value = json.loads(section)
        if not isinstance(value, list) or not value:
            raise ValueError("expected a non-empty list of calls")
        return [ToolCall(call["name"], arguments_json(call["parameters"])) for call in value]

    def partial_calls(self, section: str) -> list[PartialCall]:
        i = skip_whitespace(section, 0)
        if i >= len(section):
            return []
        if section[i] != "[":
            raise ValueError("expected a list of calls")
        return partial_calls_from_list(section, i)
