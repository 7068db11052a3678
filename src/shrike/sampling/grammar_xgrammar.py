"""The xgrammar backend: grammars precompiled against the vocabulary (optional: pip install shrike[xgrammar])."""
from __future__ import annotations

import re
import threading

import torch

from shrike.sampling.grammar import (CompiledGrammar, GrammarCompiler, GrammarError, GrammarSpec, Matcher,
                                     choice_grammar_lark, looks_like_ebnf, one_line)

try:
    import xgrammar
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(f"the xgrammar backend needs the xgrammar package ({e}); pip install 'shrike[xgrammar]' "
                      "or use --structured-outputs-backend llguidance") from None


# Keywords xgrammar enforces, plus annotations that constrain nothing. Anything else in a schema would be
# silently ignored by xgrammar, so it is refused instead.
_ENFORCED = {"type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
             "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "pattern", "format",
             "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
             "patternProperties", "propertyNames", "minProperties", "maxProperties", "unevaluatedProperties",
             "unevaluatedItems", "additionalItems", "multipleOf"}
_ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                "readOnly", "writeOnly", "strict", "discriminator"}
# Keywords whose value is a map of names to schemas, or a list of schemas.
_SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions"}
_SCHEMA_LISTS = {"anyOf", "oneOf", "allOf", "prefixItems"}
_LOCATION = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


def check_enforceable(schema, path: str = "#") -> None:
    """Raise GrammarError naming the first keyword xgrammar would ignore."""
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        if key not in _ENFORCED and key not in _ANNOTATIONS:
            raise GrammarError(f"the JSON schema uses {key!r} at {path}, which the xgrammar backend cannot enforce")
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                check_enforceable(sub, f"{path}/{key}/{name}")
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                check_enforceable(sub, f"{path}/{key}/{i}")
        elif key in ("items", "additionalProperties", "propertyNames", "additionalItems", "unevaluatedProperties",
                     "unevaluatedItems"):
            check_enforceable(value, f"{path}/{key}")


class XGrammarCompiler(GrammarCompiler):
    name = "xgrammar"

    def __init__(self, tokenizer, vocab_size: int):
        super().__init__(tokenizer, vocab_size)
        self._compiler: xgrammar.GrammarCompiler | None = None
        self._init_lock = threading.Lock()

    def xgrammar_compiler(self) -> xgrammar.GrammarCompiler:
        with self._init_lock:
            if self._compiler is None:
                metadata = xgrammar.TokenizerInfo._detect_metadata_from_hf(self.tokenizer.tokenizer_json())
                vocab = self.tokenizer.token_strings()
                info = xgrammar.TokenizerInfo(vocab, metadata["vocab_type"], vocab_size=self.vocab_size,
                                              stop_token_ids=sorted(self.tokenizer.eos_token_ids),
                                              add_prefix_space=metadata["add_prefix_space"])
                self._compiler = xgrammar.GrammarCompiler(info, max_threads=1)
            return self._compiler

    def _compile(self, spec: GrammarSpec) -> CompiledGrammar:
        compiler = self.xgrammar_compiler()
        try:
            if spec.kind == "json_schema":
                check_enforceable(spec.value)
                compiled = compiler.compile_json_schema(spec.value, any_whitespace=False, strict_mode=True)
            elif spec.kind == "json_object":
                compiled = compiler.compile_json_schema({"type": "object"}, any_whitespace=False)
            elif spec.kind == "regex":
                compiled = compiler.compile_regex(spec.value)
            elif spec.kind == "choice":
                compiled = compiler.compile_lark(choice_grammar_lark(spec.value))
            elif spec.kind == "grammar":
                compiled = (compiler.compile_grammar(spec.value) if looks_like_ebnf(spec.value)
                            else compiler.compile_lark(spec.value))
            elif spec.kind == "structural_tag":
                tags = [xgrammar.StructuralTagItem(begin=s["begin"], schema=s["schema"], end=s["end"])
                        for s in spec.value["structures"]]
                compiled = compiler.compile_structural_tag(tags, spec.value["triggers"])
            else:
                raise GrammarError(f"unknown constraint kind {spec.kind!r}")
        except GrammarError:
            raise
        except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError and friends for bad input
            raise GrammarError(f"invalid or not enforceable by xgrammar: {_LOCATION.sub('', one_line(e))}") from None
        return _Compiled(compiled)


class _Compiled(CompiledGrammar):
    def __init__(self, compiled: xgrammar.CompiledGrammar):
        self.compiled = compiled

    def matcher(self) -> Matcher:
        return _Matcher(xgrammar.GrammarMatcher(self.compiled))


class _Matcher(Matcher):
    def __init__(self, matcher: xgrammar.GrammarMatcher):
        self._matcher = matcher

    def fill_mask(self, mask: torch.Tensor) -> None:
        self._matcher.fill_next_token_bitmask(mask.view(1, -1), 0)

    def accept(self, token_id: int) -> bool:
        return self._matcher.accept_token(token_id)

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()
