"""Llama 3.1 / 3.2 JSON format: [<|python_tag|>]{"name": ..., "parameters": {...}}; calls separated by ';'."""
from __future__ import annotations

from shrike.server.tools.base import PartialCall, ToolCall, ToolParser
from shrike.server.tools.json_calls import call_from_object, partial_call_from_object
from shrike.server.tools.partial_json import skip_whitespace

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    keeps_special_tokens = True  # <|python_tag|>

    def section_start(self, text: str) -> int | None:
        start = skip_whitespace(text, 0)
        if text.startswith(PYTHON_TAG, start) or text.startswith("{", start):
            return start
        return None

    def possible_start_length(self, text: str) -> int:
        # Only the very beginning of an output can open a section; hold it until it is clear.
        stripped = text.lstrip()
        return len(text) if stripped and PYTHON_TAG.startswith(stripped) and stripped != PYTHON_TAG else 0

    def _objects_start(self, section: str) -> int:
        return len(PYTHON_TAG) if section.startswith(PYTHON_TAG) else 0

    def calls(self, section: str) -> list[ToolCall]:
        calls, pos = [], self._objects_start(section)
        while True:
            call, end = call_from_object(section, pos)
            calls.append(call)
            pos = skip_whitespace(section, end)
            if pos >= len(section):
                return calls
            if section[pos] != ";":
                raise ValueError("expected ';' between tool calls")
            pos += 1

    def partial_calls(self, section: str) -> list[PartialCall]:
        calls, pos = [], self._objects_start(section)
        while pos < len(section):
            call, end = partial_call_from_object(section, pos)
            if call is not None:
                calls.append(call)
            if end is None:
                break
            pos = skip_whitespace(section, end)
            if pos < len(section) and section[pos] == ";":
                pos += 1
            elif pos < len(section):
                raise ValueError("expected ';' between tool calls")
        return calls
