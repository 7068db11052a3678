"""JSON schemas as vLLM's default backend (xgrammar, strict mode) enforces them: no undeclared keys.

JSON Schema allows any extra key unless a schema says `additionalProperties: false`; a grammar that
follows that lets a small model invent keys (`get_time(**arguments)` then fails). xgrammar's strict
mode, which vLLM uses, treats an absent `additionalProperties` as false; llguidance follows JSON
Schema. So, for both backends, every object schema that declares `properties` or
`patternProperties` and says nothing about `additionalProperties` is closed. A schema that allows
extra keys (`additionalProperties: true` or a schema) keeps them, and a bare `{"type": "object"}`
stays free-form. Members of an `allOf` with several members are left open: each one closed would
refuse the keys the others declare.
"""
from __future__ import annotations

import copy
from typing import Any

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "additionalItems", "contains", "not", "if", "then", "else",
                  "propertyNames", "unevaluatedProperties", "unevaluatedItems")


def closed_objects(schema: Any) -> Any:
    """A copy of schema with undeclared keys refused wherever the schema is silent about them."""
    schema = copy.deepcopy(schema)
    _close(schema, close_here=True)
    return schema


def _close(schema: Any, close_here: bool) -> None:
    if not isinstance(schema, dict):
        return
    declares_keys = "properties" in schema or "patternProperties" in schema
    silent = "additionalProperties" not in schema and "unevaluatedProperties" not in schema
    if close_here and declares_keys and silent:
        schema["additionalProperties"] = False
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for sub in schema[key].values():
                _close(sub, close_here=True)
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for sub in schema[key]:
                _close(sub, close_here=True)
    if isinstance(schema.get("allOf"), list):
        several = len(schema["allOf"]) > 1
        for sub in schema["allOf"]:
            _close(sub, close_here=not several)
    for key in _SCHEMA_VALUES:
        if key in schema:
            _close(schema[key], close_here=True)
