"""What a tool-call parser is: finds the calls in a model's output, whole or as it streams."""
from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from shrike.sampling.grammar import GrammarSpec


# What reading a malformed section can raise (deep nesting included); never a server error.
PARSE_ERRORS = (ValueError, SyntaxError, TypeError, KeyError, RecursionError, MemoryError)


def new_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text
    id: str = field(default_factory=new_call_id)

    def as_dict(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class PartialCall:
    """One call in a tool-call section that may be unfinished."""

    name: str | None  # None until the name is complete
    arguments: str  # the raw argument text so far; only ever grows as the section grows


class ToolParser(ABC):
    """One model family's tool-call format.

    Subclasses name the text that opens a tool-call section and read the calls in a section.
    Everything before the section is content. A section that does not parse is returned as
    content, never an error.
    """

    # The special tokens of the format must stay in the text for this parser to see them.
    keeps_special_tokens = False

    @abstractmethod
    def section_start(self, text: str) -> int | None:
        """Where the tool-call section begins in text, or None if it has not (yet)."""

    def possible_start_length(self, text: str) -> int:
        """How many trailing characters of text could be the beginning of a section (held back while streaming)."""
        return 0

    @abstractmethod
    def calls(self, section: str) -> list[ToolCall]:
        """All calls in a complete section; raise ValueError (or SyntaxError) if it is malformed."""

    @abstractmethod
    def partial_calls(self, section: str) -> list[PartialCall]:
        """The calls readable so far in an unfinished section; raise ValueError if it is already malformed."""

    def call_grammar(self, tools: list[dict]) -> GrammarSpec | None:
        """For tool_choice auto: a grammar leaving text free and constraining each call once the model opens it."""
        return None

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """A whole output -> (content, tool calls)."""
        start = self.section_start(text)
        if start is None:
            return text, []
        try:
            calls = self.calls(text[start:])
        except PARSE_ERRORS:
            return text, []
        if not calls:
            return text, []
        return text[:start].strip() or None, calls


def trailing_prefix_length(text: str, marker: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of marker."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0


def arguments_json(value) -> str:
    if not isinstance(value, dict):
        raise ValueError("tool call arguments must be a JSON object")
    return json.dumps(value, ensure_ascii=False)
