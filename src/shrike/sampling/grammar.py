"""Grammars that constrain generation: what a request asks for, compiled by a backend into per-sequence matchers.

Two backends, chosen with `--structured-outputs-backend`:

- ``llguidance`` (default): builds token masks lazily from the grammar, so a fresh JSON schema costs
  almost nothing up front;
- ``xgrammar``: precompiles a grammar against the vocabulary (an optional dependency,
  ``pip install shrike[xgrammar]``).

A matcher answers two questions per step: which tokens may come next (as a bitmask, one bit per
token id, 32 per int32 word) and whether a sampled token is accepted.
"""
from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from shrike.sampling.closed_objects import closed_objects
from shrike.tokenizer import Tokenizer

# Compiled grammars kept for reuse (the same schema sent again skips compilation).
COMPILED_CACHE_SIZE = 128


class GrammarError(ValueError):
    """The request's schema, regex or grammar is invalid or uses what the backend cannot enforce."""


@dataclass(frozen=True)
class GrammarSpec:
    """One constraint as a request states it.

    kind: json_schema (value: the schema, dict), json_object, regex (str), choice (list of str),
    grammar (Lark or EBNF text), structural_tag (dict with structures and triggers).
    param: the request field it came from, which error messages name first.
    """

    kind: str
    value: Any
    param: str

    def key(self) -> str:
        # Key order is kept: a schema's property order is the order the answer is written in.
        return json.dumps([self.kind, self.value], ensure_ascii=False)


def mask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


class Matcher(ABC):
    """One sequence's position in its grammar. Not thread-safe: one caller at a time."""

    @abstractmethod
    def fill_mask(self, mask: torch.Tensor) -> None:
        """mask: (mask_words(V),) int32, contiguous; bit t set <=> token t may come next."""

    @abstractmethod
    def accept(self, token_id: int) -> bool:
        """Advance by a sampled token; False if the grammar does not allow it."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """The grammar is complete (only an end-of-sequence token may follow) or broken."""


class CompiledGrammar(ABC):
    vocab_size: int  # width of the masks its matchers fill (the model's vocabulary)

    @abstractmethod
    def matcher(self) -> Matcher:
        ...


class GrammarCompiler(ABC):
    """Turns GrammarSpecs into CompiledGrammars for one tokenizer; safe to call from several threads."""

    name: str

    def __init__(self, tokenizer: Tokenizer, vocab_size: int):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size  # of the model's logits, which may exceed the tokenizer's
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Raise GrammarError with a message that starts with spec.param."""
        spec = _without_undeclared_keys(spec)
        key = spec.key()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        try:
            compiled = self._compile(spec)
        except GrammarError as e:
            raise GrammarError(f"{spec.param}: {e}") from None
        compiled.vocab_size = self.vocab_size
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > COMPILED_CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    @abstractmethod
    def _compile(self, spec: GrammarSpec) -> CompiledGrammar:
        ...

    def warm_up(self) -> None:
        """Do the one-time work (the backend's view of the vocabulary) before the first request needs it."""
        self.compile(GrammarSpec("json_object", None, "warm-up"))


def _without_undeclared_keys(spec: GrammarSpec) -> GrammarSpec:
    """Both backends refuse keys a JSON schema does not declare, as vLLM's default backend does."""
    if spec.kind == "json_schema" and isinstance(spec.value, dict):
        return GrammarSpec(spec.kind, closed_objects(spec.value), spec.param)
    if spec.kind == "structural_tag" and isinstance(spec.value, dict):
        structures = [{**s, "schema": closed_objects(s["schema"])} if isinstance(s, dict) and "schema" in s else s
                      for s in spec.value.get("structures", [])]
        return GrammarSpec(spec.kind, {**spec.value, "structures": structures}, spec.param)
    return spec


def looks_like_ebnf(grammar: str) -> bool:
    """GBNF / EBNF rules are written `name ::= ...`; Lark rules `name: ...`."""
    return "::=" in grammar


def choice_grammar_lark(choices: list[str]) -> str:
    # JSON string literals are valid Lark string literals (the escapes agree).
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def one_line(text: str) -> str:
    return " ".join(str(text).split())
