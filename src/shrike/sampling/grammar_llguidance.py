"""The llguidance backend: grammars as llguidance definitions, masks computed lazily per step."""
from __future__ import annotations

import threading

import llguidance
import torch

from shrike.sampling.grammar import (CompiledGrammar, GrammarCompiler, GrammarError, GrammarSpec, Matcher,
                                     choice_grammar_lark, one_line)

# Compact JSON (", " and ": ", no free whitespace): a small model given free whitespace can spend its
# whole token budget on newlines. Unknown schema keywords are errors, never silently ignored.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": False}


class LLGuidanceCompiler(GrammarCompiler):
    name = "llguidance"

    def __init__(self, tokenizer, vocab_size: int):
        super().__init__(tokenizer, vocab_size)
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._tokenizer_lock = threading.Lock()

    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        """Built on first use (about a second for a 50k vocabulary); the server warms it up at start."""
        with self._tokenizer_lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = llguidance.LLTokenizer(
                    self.tokenizer.tokenizer_json(), n_vocab=self.vocab_size,
                    eos_token=sorted(self.tokenizer.eos_token_ids))
            return self._ll_tokenizer

    def _compile(self, spec: GrammarSpec) -> CompiledGrammar:
        grammar = _definition(spec)
        tokenizer = self.ll_tokenizer()
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        if is_error:
            raise GrammarError(_describe(spec, messages[0]))
        return _Compiled(tokenizer, grammar)


def _definition(spec: GrammarSpec) -> str:
    try:
        if spec.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(spec.value, overrides=_JSON_OPTIONS)
        if spec.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=_JSON_OPTIONS)
        if spec.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec.value)
        if spec.kind == "choice":
            return llguidance.LLMatcher.grammar_from_lark(choice_grammar_lark(spec.value))
        if spec.kind == "grammar":
            return llguidance.grammar_from("grammar", spec.value)  # Lark, or GBNF converted to Lark
        if spec.kind == "structural_tag":
            return llguidance.LLMatcher.grammar_from_lark(_structural_tag_lark(spec.value))
    except (ValueError, AssertionError) as e:
        raise GrammarError(one_line(e) or "invalid") from None
    raise GrammarError(f"unknown constraint kind {spec.kind!r}")


def _structural_tag_lark(tag: dict) -> str:
    """vLLM's {"structures": [{"begin", "schema", "end"}], "triggers": [...]}: free text, then tagged JSON."""
    tags = []
    for structure in tag["structures"]:
        trigger = next((t for t in tag["triggers"] if structure["begin"].startswith(t)), None)
        if trigger is None:
            raise GrammarError(f"the begin {structure['begin']!r} starts with none of the triggers")
        tags.append(llguidance.StructTag(trigger=trigger, begin=structure["begin"], grammar=structure["schema"],
                                         end=structure["end"]))
    return llguidance.StructTag.to_grammar(tags, assume_special=False)


def _describe(spec: GrammarSpec, message: str) -> str:
    what = {"json_schema": "the JSON schema", "json_object": "the JSON grammar", "regex": "the regex",
            "choice": "the choices", "grammar": "the grammar", "structural_tag": "the structural tag"}[spec.kind]
    return f"{what} is invalid or uses what cannot be enforced: {one_line(message)}"


class _Compiled(CompiledGrammar):
    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar: str):
        self.tokenizer, self.grammar = tokenizer, grammar

    def matcher(self) -> Matcher:
        return _Matcher(llguidance.LLMatcher(self.tokenizer, self.grammar, log_level=0))


class _Matcher(Matcher):
    def __init__(self, matcher: llguidance.LLMatcher):
        self._matcher = matcher

    def fill_mask(self, mask: torch.Tensor) -> None:
        # Releases the GIL while it runs, so the model step can proceed meanwhile.
        self._matcher.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * mask.element_size())

    def accept(self, token_id: int) -> bool:
        return self._matcher.consume_token(token_id)

    def is_terminated(self) -> bool:
        return self._matcher.is_stopped()
