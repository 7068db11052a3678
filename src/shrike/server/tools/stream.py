"""Streaming a chat answer that may contain tool calls: content deltas, then tool-call deltas.

Text that may open a tool-call section is held back until it is clear. Inside a section, a call is
announced (id, name) once its name is complete; its arguments follow as raw text, so the
concatenation of a call's argument deltas is the JSON the model wrote. A section that turns out
malformed comes back as content when the output ends.
"""
from __future__ import annotations

from dataclasses import dataclass

from shrike.server.tools.base import PARSE_ERRORS, ToolParser, new_call_id


@dataclass
class _SentCall:
    id: str
    arguments_sent: int = 0


class ToolCallStream:
    def __init__(self, parser: ToolParser):
        self.parser = parser
        self.text = ""
        self.content_sent = 0  # characters of text already sent as content
        self.section: int | None = None  # where the tool-call section starts in text
        self.sent: list[_SentCall] = []
        self.malformed = False

    @property
    def has_calls(self) -> bool:
        return bool(self.sent)

    def push(self, piece: str) -> list[dict]:
        """New text -> the delta dicts to send ({"content": ...} or {"tool_calls": [...]})."""
        self.text += piece
        deltas = []
        if self.section is None:
            start = self.parser.section_start(self.text)
            if start is None:
                safe = len(self.text) - self.parser.possible_start_length(self.text)
                deltas += self._content(safe)
                return deltas
            deltas += self._content(start)
            self.section = start
        if not self.malformed:
            try:
                partial = self.parser.partial_calls(self.text[self.section:])
            except PARSE_ERRORS:
                self.malformed = True  # sent as content at the end, unless calls went out already
                return deltas
            deltas += self._calls(partial)
        return deltas

    def finish(self) -> list[dict]:
        """The output ended: send what is left, as calls if the section parses, else as content."""
        if self.section is None:
            return self._content(len(self.text))
        try:
            complete = self.parser.calls(self.text[self.section:])
            partial = self.parser.partial_calls(self.text[self.section:])
        except PARSE_ERRORS:
            complete = partial = []
        if not complete:
            return [] if self.sent else self._content(len(self.text))
        return self._calls(partial)

    def _content(self, end: int) -> list[dict]:
        if end <= self.content_sent:
            return []
        text = self.text[self.content_sent:end]
        self.content_sent = end
        return [{"content": text}]

    def _calls(self, partial) -> list[dict]:
        deltas = []
        for index, call in enumerate(partial):
            if call.name is None:
                break
            if index == len(self.sent):
                self.sent.append(_SentCall(new_call_id()))
                deltas.append({"tool_calls": [{"index": index, "id": self.sent[index].id, "type": "function",
                                               "function": {"name": call.name, "arguments": ""}}]})
            sent = self.sent[index]
            if len(call.arguments) > sent.arguments_sent:
                deltas.append({"tool_calls": [{"index": index, "function": {
                    "arguments": call.arguments[sent.arguments_sent:]}}]})
                sent.arguments_sent = len(call.arguments)
        return deltas
