"""Structured outputs from a request's fields: OpenAI's response_format, vLLM's structured_outputs and guided_*."""
from __future__ import annotations

import asyncio
import json
from typing import Any

from shrike.sampling.grammar import CompiledGrammar, GrammarError, GrammarSpec
from shrike.server.context import ServerContext
from shrike.server.errors import bad_request
from shrike.server.protocol import SamplingRequest

_STRUCTURED_KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar",
                     "structural_tag": "structural_tag"}


def requested_grammar(body: SamplingRequest) -> GrammarSpec | None:
    """The one constraint the request asks for, checked for shape (the backend checks the content)."""
    specs = [spec for spec in (_response_format(body), _structured_outputs(body), _guided(body)) if spec]
    if len(specs) > 1:
        raise bad_request(f"give only one of response_format, structured_outputs and guided_* (got "
                          f"{', '.join(s.param for s in specs)})", specs[1].param)
    return specs[0] if specs else None


async def compile_grammar(ctx: ServerContext, spec: GrammarSpec) -> CompiledGrammar:
    """400 naming the field for a schema, regex or grammar that is invalid or cannot be enforced."""
    try:
        # Off the event loop: a first use builds the backend's view of the vocabulary.
        return await asyncio.to_thread(ctx.grammar_compiler.compile, spec)
    except GrammarError as e:
        raise bad_request(str(e), spec.param.split(".")[0]) from None


def _response_format(body: SamplingRequest) -> GrammarSpec | None:
    response_format = body.response_format
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return GrammarSpec("json_object", None, "response_format")
    if response_format.json_schema is None or response_format.json_schema.schema_ is None:
        raise bad_request("response_format: type json_schema needs json_schema.schema (a JSON schema object)",
                          "response_format")
    return GrammarSpec("json_schema", response_format.json_schema.schema_, "response_format")


def _structured_outputs(body: SamplingRequest) -> GrammarSpec | None:
    request = body.structured_outputs
    if request is None:
        return None
    given = {name: getattr(request, "json_" if name == "json" else name) for name in _STRUCTURED_KINDS}
    given = {name: value for name, value in given.items() if value is not None}
    if request.json_object:
        given["json_object"] = True
    if len(given) != 1:
        raise bad_request("structured_outputs: give exactly one of json, regex, choice, grammar, structural_tag, "
                          f"json_object (got {', '.join(given) or 'none'})", "structured_outputs")
    (name, value), = given.items()
    param = f"structured_outputs.{name}"
    if name == "json_object":
        return GrammarSpec("json_object", None, param)
    return _spec(_STRUCTURED_KINDS[name], value, param)


def _guided(body: SamplingRequest) -> GrammarSpec | None:
    given = {name: getattr(body, f"guided_{name}") for name in ("json", "regex", "choice", "grammar")}
    given = {name: value for name, value in given.items() if value is not None}
    if len(given) > 1:
        raise bad_request(f"give only one guided_* field (got {', '.join('guided_' + n for n in given)})",
                          f"guided_{next(iter(given))}")
    if not given:
        return None
    (name, value), = given.items()
    return _spec(_STRUCTURED_KINDS[name], value, f"guided_{name}")


def _spec(kind: str, value: Any, param: str) -> GrammarSpec:
    if kind in ("json_schema", "structural_tag") and isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise bad_request(f"{param}: not valid JSON ({e})", param.split(".")[0]) from None
    if kind == "json_schema" and not isinstance(value, dict):
        raise bad_request(f"{param}: a JSON schema must be an object", param.split(".")[0])
    if kind == "choice" and (not value or not all(isinstance(c, str) and c for c in value)):
        raise bad_request(f"{param}: give a non-empty list of non-empty strings", param.split(".")[0])
    if kind in ("regex", "grammar") and not value.strip():
        raise bad_request(f"{param}: must not be empty", param.split(".")[0])
    if kind == "structural_tag":
        _check_structural_tag(value, param)
    return GrammarSpec(kind, value, param)


def _check_structural_tag(tag: Any, param: str) -> None:
    structures = tag.get("structures") if isinstance(tag, dict) else None
    triggers = tag.get("triggers") if isinstance(tag, dict) else None
    ok = isinstance(structures, list) and structures and isinstance(triggers, list) and triggers and all(
        isinstance(t, str) and t for t in triggers) and all(
        isinstance(s, dict) and isinstance(s.get("begin"), str) and isinstance(s.get("end"), str)
        and isinstance(s.get("schema"), dict) for s in structures)
    if not ok:
        raise bad_request(f'{param}: expected {{"structures": [{{"begin", "schema", "end"}}, ...], "triggers": '
                          '[...]}', param.split(".")[0])
