"""The structured-outputs backends by name (`--structured-outputs-backend`); each imports its library only when chosen."""
from __future__ import annotations

from shrike.sampling.grammar import GrammarCompiler
from shrike.tokenizer import Tokenizer

BACKENDS = ("llguidance", "xgrammar")


def new_grammar_compiler(backend: str, tokenizer: Tokenizer, vocab_size: int) -> GrammarCompiler:
    if backend == "llguidance":
        from shrike.sampling.grammar_llguidance import LLGuidanceCompiler
        return LLGuidanceCompiler(tokenizer, vocab_size)
    if backend == "xgrammar":
        from shrike.sampling.grammar_xgrammar import XGrammarCompiler
        return XGrammarCompiler(tokenizer, vocab_size)
    raise ValueError(f"unknown structured outputs backend {backend!r}; use one of {', '.join(BACKENDS)}")
