"""vLLM's offline structured-outputs parameters: SamplingParams(structured_outputs=StructuredOutputsParams(...)).

GuidedDecodingParams is the older name (SamplingParams(guided_decoding=...)); both hold exactly one
constraint, which LLM compiles with the llguidance backend before generating.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shrike.sampling.grammar import GrammarSpec


@dataclass
class StructuredOutputsParams:
    json: dict[str, Any] | str | None = None  # a JSON schema (or its text)
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # Lark or GBNF
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None

    def __post_init__(self):
        self.spec(param="structured_outputs")  # refuse a malformed constraint where it is made

    def spec(self, param: str) -> "GrammarSpec":
        from shrike.sampling.grammar import GrammarSpec  # torch-free until a constraint is compiled
        given = {name: value for name, value in (("json", self.json), ("regex", self.regex), ("choice", self.choice),
                                                 ("grammar", self.grammar), ("structural_tag", self.structural_tag))
                 if value is not None}
        if self.json_object:
            given["json_object"] = True
        if len(given) != 1:
            raise ValueError(f"{param}: give exactly one of json, regex, choice, grammar, json_object, structural_tag "
                             f"(got {', '.join(given) or 'none'})")
        (name, value), = given.items()
        if name == "json_object":
            return GrammarSpec("json_object", None, f"{param}.json_object")
        if name in ("json", "structural_tag") and isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as e:
                raise ValueError(f"{param}.{name}: not valid JSON ({e})") from None
        if name == "choice" and (not value or not all(isinstance(c, str) and c for c in value)):
            raise ValueError(f"{param}.choice: give a non-empty list of non-empty strings")
        kind = "json_schema" if name == "json" else name
        return GrammarSpec(kind, value, f"{param}.{name}")


GuidedDecodingParams = StructuredOutputsParams
