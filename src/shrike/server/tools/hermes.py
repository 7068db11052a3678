"""Hermes / Qwen2.5 / Qwen3 format: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block per call."""
from __future__ import annotations

import json

from shrike.sampling.grammar import GrammarSpec
from shrike.server.tools.base import PartialCall, ToolCall, ToolParser, trailing_prefix_length
from shrike.server.tools.forced import parameters_schema
from shrike.server.tools.json_calls import call_from_object, partial_call_from_object
from shrike.server.tools.partial_json import skip_whitespace

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    def section_start(self, text: str) -> int | None:
        start = text.find(OPEN)
        return None if start < 0 else start

    def possible_start_length(self, text: str) -> int:
        return trailing_prefix_length(text, OPEN)

    def call_grammar(self, tools: list[dict]) -> GrammarSpec:
        # After the model writes <tool_call>, it can only go on with one of the tools' names and valid arguments.
        structures = [{"begin": f'{OPEN}\n{{"name": {json.dumps(t["function"]["name"], ensure_ascii=False)}, '
                                '"arguments": ',
                       "schema": parameters_schema(t), "end": f"}}\n{CLOSE}"} for t in tools]
        return GrammarSpec("structural_tag", {"structures": structures, "triggers": [OPEN]}, "tools")

    def calls(self, section: str) -> list[ToolCall]:
        calls, pos = [], 0
        while (start := section.find(OPEN, pos)) >= 0:
            call, end = call_from_object(section, start + len(OPEN))
            close = skip_whitespace(section, end)
            if not section.startswith(CLOSE, close) and close < len(section):
                raise ValueError(f"expected {CLOSE}")
            calls.append(call)
            pos = close + len(CLOSE) if section.startswith(CLOSE, close) else close
        return calls

    def partial_calls(self, section: str) -> list[PartialCall]:
        calls, pos = [], 0
        while (start := section.find(OPEN, pos)) >= 0:
            call, end = partial_call_from_object(section, start + len(OPEN))
            if call is not None:
                calls.append(call)
            if end is None:
                break
            pos = end
        return calls
