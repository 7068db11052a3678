"""One streamed chat choice: its text as OpenAI deltas (reasoning_content, content, tool_calls)."""
from __future__ import annotations

from shrike.server.reasoning import ReasoningParser, ReasoningStream
from shrike.server.tools.base import ToolParser
from shrike.server.tools.stream import ToolCallStream


class ChoiceDeltas:
    def __init__(self, reasoning: ReasoningParser | None, tools: ToolParser | None):
        self.reasoning = ReasoningStream(reasoning) if reasoning is not None else None
        self.tools = ToolCallStream(tools) if tools is not None else None

    @property
    def has_calls(self) -> bool:
        return self.tools is not None and self.tools.has_calls

    def push(self, text: str) -> list[dict]:
        if not text:
            return []
        pieces = self.reasoning.push(text) if self.reasoning is not None else [("content", text)]
        return self._deltas(pieces)

    def finish(self) -> list[dict]:
        deltas = self._deltas(self.reasoning.finish()) if self.reasoning is not None else []
        if self.tools is not None:
            deltas += self.tools.finish()
        return deltas

    def _deltas(self, pieces: list[tuple[str, str]]) -> list[dict]:
        deltas = []
        for kind, text in pieces:
            if kind == "reasoning":
                deltas.append({"reasoning_content": text})
            elif self.tools is not None:
                deltas += self.tools.push(text)
            else:
                deltas.append({"content": text})
        return deltas
