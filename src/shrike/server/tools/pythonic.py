"""Pythonic format (Llama 3.2 / 4, ToolACE): [get_weather(city="Paris"), get_time(zone="CET")]."""
from __future__ import annotations

import ast
import re

from shrike.server.tools.base import PartialCall, ToolCall, ToolParser, arguments_json

_START = re.compile(r"\s*(<\|python_start\|>)?\s*\[\s*[A-Za-z_][\w.]*\(")
_PYTHON_END = "<|python_end|>"


class PythonicToolParser(ToolParser):
    keeps_special_tokens = True  # <|python_start|> and <|python_end|>

    def section_start(self, text: str) -> int | None:
        return 0 if _START.match(text) else None

    def possible_start_length(self, text: str) -> int:
        # A section can only open the output: hold the start until it is clearly a call list or not.
        stripped = text.lstrip().removeprefix("<|python_start|>").lstrip()
        if not stripped or re.fullmatch(r"\[\s*([A-Za-z_][\w.]*)?", stripped) or "<|python_start|>".startswith(
                text.strip()):
            return len(text)
        return 0

    def calls(self, section: str) -> list[ToolCall]:
        body = section.strip().removeprefix("<|python_start|>").removesuffix(_PYTHON_END).strip()
        tree = ast.parse(body, mode="eval").body
        if not isinstance(tree, ast.List) or not tree.elts:
            raise ValueError("expected a list of calls")
        return [_call(node) for node in tree.elts]

    def partial_calls(self, section: str) -> list[PartialCall]:
        body = section.lstrip().removeprefix("<|python_start|>").lstrip()
        return [PartialCall(call.name, call.arguments) for call in
                (_call(ast.parse(body[start:end], mode="eval").body) for start, end in _complete_call_spans(body))]


def _call(node: ast.AST) -> ToolCall:
    if not isinstance(node, ast.Call) or node.args:
        raise ValueError("expected name(keyword=value, ...)")
    name = ast.unparse(node.func)
    arguments = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise ValueError("**kwargs is not a tool call argument")
        arguments[keyword.arg] = ast.literal_eval(keyword.value)
    return ToolCall(name, arguments_json(arguments))


def _complete_call_spans(body: str) -> list[tuple[int, int]]:
    """(start, end) of each call in the list that is already closed."""
    spans, depth, quote, start, i = [], 0, None, None, 0
    while i < len(body):
        c = body[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
            if depth == 2 and c == "(" and start is None:
                start = _name_start(body, i)
        elif c in ")]}":
            depth -= 1
            if depth == 1 and c == ")" and start is not None:
                spans.append((start, i + 1))
                start = None
            if depth == 0:
                break
        i += 1
    return spans


def _name_start(body: str, paren: int) -> int:
    i = paren
    while i > 0 and (body[i - 1].isalnum() or body[i - 1] in "_."):
        i -= 1
    return i
