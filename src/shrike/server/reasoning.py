"""--reasoning-parser: a thinking model's <think>...</think> goes to reasoning_content, the rest to content.

deepseek_r1: the chat template opens <think> itself, so the output starts inside the reasoning (a leading
<think> is dropped) and everything up to </think> is reasoning, all of it if </think> never comes.
qwen3: reasoning only if the output opens with <think>; otherwise it is all content.
"""
from __future__ import annotations

from shrike.sampling.grammar import CompiledGrammar, Matcher
from shrike.server.tools.base import trailing_prefix_length

OPEN, CLOSE = "<think>", "</think>"
PARSERS = ("deepseek_r1", "qwen3")


class ReasoningParser:
    def __init__(self, name: str):
        if name not in PARSERS:
            raise ValueError(f"unknown reasoning parser {name!r}; use one of {', '.join(PARSERS)}")
        self.starts_inside = name == "deepseek_r1"

    def split(self, text: str) -> tuple[str | None, str]:
        """A whole output -> (reasoning or None, content)."""
        stream = ReasoningStream(self)
        parts = stream.push(text) + stream.finish()
        reasoning = "".join(t for kind, t in parts if kind == "reasoning")
        content = "".join(t for kind, t in parts if kind == "content")
        return (reasoning if stream.had_reasoning else None), content


class ReasoningStream:
    """Splits streamed text into ("reasoning", text) and ("content", text) pieces, holding back partial tags."""

    def __init__(self, parser: ReasoningParser):
        self.state = "start"
        self.starts_inside = parser.starts_inside
        self.held = ""
        self.had_reasoning = False
        self.after_close = False  # just past </think>: newlines before the answer are dropped

    def push(self, piece: str) -> list[tuple[str, str]]:
        self.held += piece
        out: list[tuple[str, str]] = []
        if self.state == "start":
            stripped = self.held.lstrip()
            if OPEN.startswith(stripped) and len(stripped) < len(OPEN):
                return out  # could still become <think>
            if stripped.startswith(OPEN):
                self.held, self.state = stripped[len(OPEN):], "reasoning"
            else:
                self.state = "reasoning" if self.starts_inside else "content"
            self.had_reasoning = self.state == "reasoning"
        if self.state == "reasoning":
            end = self.held.find(CLOSE)
            if end < 0:
                keep = trailing_prefix_length(self.held, CLOSE)
                text, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
                return out + ([("reasoning", text)] if text else [])
            if end:
                out.append(("reasoning", self.held[:end]))
            self.held, self.state, self.after_close = self.held[end + len(CLOSE):], "content", True
        if self.state == "content" and self.after_close:
            self.held = self.held.lstrip("\n")  # the blank line between reasoning and answer
            self.after_close = not self.held
        if self.state == "content" and self.held:
            out.append(("content", self.held))
            self.held = ""
        return out

    def finish(self) -> list[tuple[str, str]]:
        if not self.held:
            return []
        reasoning = self.state == "reasoning" or (self.state == "start" and self.starts_inside)
        self.had_reasoning = self.had_reasoning or reasoning
        text, self.held = self.held, ""
        return [("reasoning" if reasoning else "content", text)]


class AfterReasoning(CompiledGrammar):
    """A grammar that starts once the reasoning has ended: anything goes until the </think> tokens."""

    def __init__(self, grammar: CompiledGrammar, end_ids: list[int]):
        self.grammar, self.end_ids = grammar, end_ids
        self.vocab_size = grammar.vocab_size

    def matcher(self) -> Matcher:
        return _AfterReasoningMatcher(self.grammar.matcher(), self.end_ids)


class _AfterReasoningMatcher(Matcher):
    def __init__(self, inner: Matcher, end_ids: list[int]):
        self.inner, self.end_ids = inner, end_ids
        self.recent: list[int] = []  # the last few tokens while still reasoning
        self.reasoning = True

    def fill_mask(self, mask) -> None:
        if self.reasoning:
            mask.fill_(-1)  # every token allowed
        else:
            self.inner.fill_mask(mask)

    def accept(self, token_id: int) -> bool:
        if not self.reasoning:
            return self.inner.accept(token_id)
        self.recent = (self.recent + [token_id])[-len(self.end_ids):]
        self.reasoning = self.recent != self.end_ids
        return True

    def is_terminated(self) -> bool:
        return not self.reasoning and self.inner.is_terminated()
