"""Mistral format: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...], or (newer tokenizers) [TOOL_CALLS]name[ARGS]{...}."""
from __future__ import annotations

import json
import re

from shrike.server.tools.base import PartialCall, ToolCall, ToolParser, arguments_json, trailing_prefix_length
from shrike.server.tools.json_calls import call_from_object, partial_calls_from_list
from shrike.server.tools.partial_json import scan_object, skip_whitespace, value_end

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


class MistralToolParser(ToolParser):
    keeps_special_tokens = True  # [TOOL_CALLS] and [ARGS] are special tokens

    def section_start(self, text: str) -> int | None:
        start = text.find(TOOL_CALLS)
        return None if start < 0 else start

    def possible_start_length(self, text: str) -> int:
        return trailing_prefix_length(text, TOOL_CALLS)

    def calls(self, section: str) -> list[ToolCall]:
        pos = skip_whitespace(section, len(TOOL_CALLS))
        if section.startswith("[", pos):
            return self._array_calls(section, pos)
        calls = []
        for block in section.split(TOOL_CALLS)[1:]:
            name, has_args, arguments = block.partition(ARGS)
            if not _NAME.fullmatch(name.strip()) or not has_args:
                raise ValueError("expected name[ARGS]{...}")
            scan = scan_object(arguments)
            if scan.end is None or arguments[scan.end:].strip():
                raise ValueError("the arguments are not one JSON object")
            calls.append(ToolCall(name.strip(), arguments_json(json.loads(arguments))))
        return calls

    def _array_calls(self, section: str, pos: int) -> list[ToolCall]:
        end = value_end(section, pos)
        if end is None:
            raise ValueError("the tool call list is unfinished")
        calls, i = [], pos + 1
        while True:
            i = skip_whitespace(section, i)
            if section[i] == "]":
                return calls
            if section[i] == ",":
                i += 1
                continue
            call, i = call_from_object(section, i)
            calls.append(call)

    def partial_calls(self, section: str) -> list[PartialCall]:
        pos = skip_whitespace(section, len(TOOL_CALLS))
        if pos >= len(section):
            return []
        if section[pos] == "[":
            return partial_calls_from_list(section, pos)
        calls = []
        for block in section.split(TOOL_CALLS)[1:]:
            name, has_args, arguments = block.partition(ARGS)
            if not has_args:
                break
            if not _NAME.fullmatch(name.strip()):
                raise ValueError("expected name[ARGS]{...}")
            scan = scan_object(arguments)
            calls.append(PartialCall(name.strip(), arguments if scan.end is None else arguments[:scan.end]))
        return calls
