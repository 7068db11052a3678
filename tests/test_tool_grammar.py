"""Undeclared keys refused on both backends, and the lazy grammar of tool_choice auto (Hermes format)."""
from __future__ import annotations

import pytest

from shrike.sampling.closed_objects import closed_objects
from shrike.sampling.grammar import GrammarSpec
from shrike.sampling.grammar_backends import new_grammar_compiler
from shrike.server.tools.hermes import HermesToolParser
from shrike.tokenizer import Tokenizer

TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}


@pytest.fixture(scope="module", params=["llguidance", "xgrammar"])
def compiler(request, default_model_dir):
    tokenizer = Tokenizer(default_model_dir)
    return new_grammar_compiler(request.param, tokenizer, tokenizer.vocab_size)


def _accepts(compiler, spec: GrammarSpec, text: str) -> bool:
    matcher = compiler.compile(spec).matcher()
    return all(matcher.accept(t) for t in compiler.tokenizer.encode(text, add_special_tokens=False))


def test_closed_objects_follow_what_the_schema_says():
    properties = {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}, "free": {"type": "object"},
                  "open": {"type": "object", "properties": {}, "additionalProperties": True}}
    schema = {"type": "object", "properties": properties,
              "$defs": {"D": {"properties": {"c": {}}}},
              "allOf": [{"properties": {"x": {}}}, {"properties": {"y": {}}}]}
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False and closed["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["free"]  # a bare object stays free-form
    assert closed["properties"]["open"]["additionalProperties"] is True
    assert closed["$defs"]["D"]["additionalProperties"] is False
    assert all("additionalProperties" not in member for member in closed["allOf"])  # each would refuse the other's
    assert "additionalProperties" not in schema  # the caller's schema is left as it was


def test_json_schema_refuses_undeclared_keys(compiler):
    spec = GrammarSpec("json_schema", TIME["function"]["parameters"], "response_format")
    assert _accepts(compiler, spec, '{"timezone": "UTC"}')
    assert not _accepts(compiler, spec, '{"timezone": "UTC", "unit": "celsius"}')


def test_auto_tool_grammar_leaves_text_free_and_holds_calls_to_the_schema(compiler):
    spec = HermesToolParser().call_grammar([TIME])
    assert _accepts(compiler, spec, 'Let me check. <tool_call>\n{"name": "get_time", "arguments": {"timezone": "UTC"}}'
                                    '\n</tool_call> Done.')
    assert _accepts(compiler, spec, "No tool is needed: it is noon.")
    assert not _accepts(compiler, spec, '<tool_call>\n{"name": "get_weather"')
    assert not _accepts(compiler, spec, '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "UTC", "x": 1}}')
