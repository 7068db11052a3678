"""The OpenAPI document at /openapi.json, made to say what the server really does.

FastAPI's generated document lists 422 for validation errors (this server answers 400 with an OpenAI
error body), knows nothing of the guards that run before an endpoint (401, 413) or of the engine's
503, and describes /metrics as JSON. This module rewrites the generated document once: every status
each endpoint can answer, with the OpenAI error schema, the real content types, and request-field
bounds that match what the server accepts.
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from shrike.sampling.params import MAX_LOGPROBS
from shrike.server.errors import RETRY_AFTER_SECONDS
from shrike.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from shrike.server.context import RESERVED_TEMPLATE_ARGUMENTS
from shrike.server.middleware import MAX_BODY_BYTES, OPEN_PATHS, OPEN_PREFIXES
from shrike.server.protocol import SEED_RANGE
from shrike.server.responses_schema import refine_responses_request
from shrike.server.sampling import token_id_pattern

ERROR_SCHEMA = {
    "type": "object", "required": ["error"], "additionalProperties": False,
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"], "additionalProperties": False,
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}

_ERROR_DESCRIPTIONS = {
    "400": "The request is invalid (not JSON, not UTF-8, a wrong field or value); `error.param` names the field.",
    "401": "The API key is missing or wrong: send `Authorization: Bearer <key>`.",
    "404": "The `model` named in the request is not served here (/v1/responses: or no response with the "
           "`previous_response_id` is stored).",
    "408": "The request body stopped arriving for longer than the server's --body-timeout; the connection is closed.",
    "413": f"The request body is larger than {MAX_BODY_BYTES >> 20} MiB.",
    "503": "The server is busy (`queue_full`, retry after `Retry-After` seconds), shutting down, or a model step "
           "failed; the request may succeed when sent again.",
}

# Statuses beyond 200 that each operation can answer (401 is added for the key-guarded paths when a key is set).
_ERRORS_BY_OPERATION = {
    ("/v1/completions", "post"): ["400", "404", "413", "503"],
    ("/v1/chat/completions", "post"): ["400", "404", "413", "503"],
    ("/v1/responses", "post"): ["400", "404", "413", "503"],
    ("/v1/embeddings", "post"): ["400", "404", "413", "503"],
    ("/v1/models/{model_id}", "get"): ["404"],
    ("/tokenize", "post"): ["400", "404", "413"],
    ("/detokenize", "post"): ["400", "404", "413"],
    ("/health", "get"): ["503"],
    ("/v1/models", "get"): [],
    ("/version", "get"): [],
    ("/metrics", "get"): [],
    ("/tokenizer_info", "get"): [],
}

_STREAMING = {("/v1/completions", "post"), ("/v1/chat/completions", "post"), ("/v1/responses", "post")}

# Bounds the engine enforces (SamplingParams.validate and the request checks); a request outside them is a 400.
_SAMPLING_BOUNDS: dict[str, dict[str, Any]] = {
    "temperature": {"minimum": 0},
    "top_p": {"exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"minimum": -1},
    "min_p": {"minimum": 0, "maximum": 1},
    "presence_penalty": {"minimum": -2, "maximum": 2},
    "frequency_penalty": {"minimum": -2, "maximum": 2},
    "repetition_penalty": {"exclusiveMinimum": 0},
    "min_tokens": {"minimum": 0},
    "top_logprobs": {"minimum": 0, "maximum": MAX_LOGPROBS},
    "logprobs": {"minimum": 0, "maximum": MAX_LOGPROBS},
}


def install_openapi(app: FastAPI, api_key_required: bool, vocab_size: int, tokenizer_vocab_size: int,
                    max_num_seqs: int, max_model_len: int) -> None:
    """vocab_size bounds prompt token ids (the model's embedding), tokenizer_vocab_size those /detokenize takes."""
    def openapi() -> dict:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi
            document = get_openapi(title=app.title, version=app.version, description=app.description,
                                   routes=app.routes)
            app.openapi_schema = corrected(document, api_key_required, vocab_size, tokenizer_vocab_size,
                                           max_num_seqs, max_model_len)
        return app.openapi_schema

    app.openapi = openapi


def corrected(document: dict, api_key_required: bool, vocab_size: int, tokenizer_vocab_size: int,
              max_num_seqs: int, max_model_len: int) -> dict:
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["ErrorResponse"] = ERROR_SCHEMA
    if api_key_required:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            _correct_operation(path, method, operation, api_key_required)
    for schema in schemas.values():
        _bound_sampling_fields(schema)
    _refine_requests(schemas, vocab_size, tokenizer_vocab_size, max_num_seqs, max_model_len)
    return document


def _correct_operation(path: str, method: str, operation: dict, api_key_required: bool) -> None:
    responses = operation["responses"]
    responses.pop("422", None)
    ok = responses.setdefault("200", {"description": "Successful Response"})
    if (path, method) in _STREAMING:
        ok["description"] = "The completion; with `stream: true`, server-sent events ending with `data: [DONE]`."
        ok["content"] = {"application/json": {"schema": {"type": "object"}},
                         # OpenAPI 3.1: the schema of one event
                         "text/event-stream": {"schema": {
                             "type": "object", "required": ["data"],
                             "properties": {"data": {"type": "string", "description": "A JSON chunk; the last "
                                                                                   "event is `[DONE]`."}}}}}
    elif path == "/metrics":
        ok["description"] = "Prometheus text exposition format."
        ok["content"] = {METRICS_CONTENT_TYPE.split(";")[0]: {"schema": {"type": "string"}}}
    elif path == "/health":
        ok["description"] = "The engine loop is running (empty body)."
        ok.pop("content", None)
    else:
        ok["content"] = {"application/json": {"schema": {"type": "object"}}}
    codes = list(_ERRORS_BY_OPERATION.get((path, method), ["400"]))
    if method == "post":
        codes.append("408")
    # The key guards every path but the open ones (APIKeyMiddleware), so each route says which it is.
    if api_key_required and path not in OPEN_PATHS and not path.startswith(OPEN_PREFIXES):
        codes.append("401")
        operation["security"] = [{"bearer": []}]
    for code in sorted(codes):
        response = {"description": _ERROR_DESCRIPTIONS[code],
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
        if code == "503":
            response["headers"] = {"Retry-After": {
                "description": f"Seconds to wait before retrying (with queue_full: {RETRY_AFTER_SECONDS})",
                "schema": {"type": "string"}}}
        elif code == "401":
            response["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
        responses[code] = response


_GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
_STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "structural_tag")


def _given(name: str) -> dict:
    return {"required": [name], "properties": {name: {"not": {"type": "null"}}}}


def _at_most_one(conditions: list[dict]) -> dict:
    return {"not": {"anyOf": [{"allOf": [a, b]} for i, a in enumerate(conditions) for b in conditions[i + 1:]]}}


def _one_constraint(schemas: dict) -> None:
    """The server takes one output constraint (structured.py): say so, so a generated request has at most one."""
    schemas["StructuredOutputs"]["oneOf"] = [
        *[_given(kind) for kind in _STRUCTURED_KINDS],
        {"required": ["json_object"], "properties": {"json_object": {"const": True}}}]
    constraints = [
        {"required": ["response_format"], "properties": {"response_format": {
            "type": "object", "required": ["type"], "properties": {"type": {"enum": ["json_object", "json_schema"]}}}}},
        _given("structured_outputs"), *[_given(name) for name in _GUIDED_FIELDS]]
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        schemas[name].setdefault("allOf", []).append(_at_most_one(constraints))
    # A forced tool call is itself the constraint (tool_choice "required" or a named function).
    forced_call = {"required": ["tool_choice"], "properties": {"tool_choice": {"anyOf": [
        {"const": "required"}, {"type": "object"}]}}}
    schemas["ChatCompletionRequest"]["allOf"].append({"not": {"allOf": [forced_call, {"anyOf": constraints}]}})


def _bound_sampling_fields(schema: dict) -> None:
    properties = schema.get("properties") or {}
    for name, bounds in _SAMPLING_BOUNDS.items():
        field = properties.get(name)
        if field is None:
            continue
        for alternative in field.get("anyOf", [field]):
            if alternative.get("type") in ("integer", "number"):
                for key, value in bounds.items():
                    alternative.setdefault(key, value)


def _refine_requests(schemas: dict, vocab_size: int, tokenizer_vocab_size: int, max_num_seqs: int,
                     max_model_len: int) -> None:
    """What the pydantic models cannot say: the values the server refuses with a 400, as JSON Schema."""
    token_id = {"type": "integer", "minimum": 0, "maximum": vocab_size - 1}
    template_kwargs = {"type": "object", "propertyNames": {"not": {"enum": list(RESERVED_TEMPLATE_ARGUMENTS)}}}

    def set_field(schema_name: str, field_name: str, *alternatives: dict, nullable: bool = True) -> None:
        properties = schemas[schema_name]["properties"]
        keep = {k: v for k, v in properties[field_name].items() if k in ("title", "default", "description")}
        choices = [*alternatives, {"type": "null"}] if nullable else list(alternatives)
        properties[field_name] = {**keep, **({"anyOf": choices} if len(choices) > 1 else choices[0])}

    # The prompt takes at least one token of the context, so at most max_model_len - 1 remain for the output.
    most_tokens = max_model_len - 1
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        schemas[name]["properties"]["n"].update(minimum=1, maximum=max_num_seqs)
        # Exact integers: as a float the upper bound rounds up past what the server accepts.
        set_field(name, "seed", {"type": "integer", "minimum": SEED_RANGE[0], "maximum": SEED_RANGE[1]})
        set_field(name, "stop", {"type": "string", "minLength": 1},
                  {"type": "array", "items": {"type": "string", "minLength": 1}})
        set_field(name, "logit_bias", {"type": "object", "propertyNames": {"pattern": token_id_pattern(vocab_size)},
                                       "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}})
        set_field(name, "stop_token_ids", {"type": "array", "items": token_id})

    completion = schemas["CompletionRequest"]
    set_field("CompletionRequest", "max_tokens", {"type": "integer", "minimum": 0, "maximum": most_tokens})
    set_field("CompletionRequest", "prompt",
              {"type": "string", "minLength": 1},
              {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
              {"type": "array", "minItems": 1, "items": token_id},
              {"type": "array", "minItems": 1, "items": {"type": "array", "minItems": 1, "items": token_id}},
              nullable=False)
    # Declared only to refuse them with a clear message: no value of theirs does anything.
    for refused in ("best_of", "suffix"):
        completion["properties"].pop(refused, None)
    # max_tokens 0 only scores the prompt, which needs echo.
    completion["if"] = {"properties": {"max_tokens": {"const": 0}}, "required": ["max_tokens"]}
    completion["then"] = {"properties": {"echo": {"const": True}}, "required": ["echo"]}

    chat = schemas["ChatCompletionRequest"]
    output_tokens = {"type": "integer", "minimum": 1, "maximum": most_tokens}
    set_field("ChatCompletionRequest", "max_completion_tokens", output_tokens)
    set_field("ChatCompletionRequest", "max_tokens", {"type": "integer"})
    set_field("ChatCompletionRequest", "chat_template_kwargs", template_kwargs)
    chat["allOf"] = [
        {"if": {"properties": {"top_logprobs": {"type": "integer"}}, "required": ["top_logprobs"]},
         "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]}},
        # max_tokens (OpenAI's older name) counts only without max_completion_tokens.
        {"if": {"properties": {"max_completion_tokens": {"type": "integer"}}, "required": ["max_completion_tokens"]},
         "else": {"properties": {"max_tokens": {"anyOf": [output_tokens, {"type": "null"}]}}}},
    ]
    # json_schema needs its schema; what a schema may say is the grammar engine's to judge (a 400 naming it).
    schemas["ResponseFormat"]["if"] = {"properties": {"type": {"const": "json_schema"}}, "required": ["type"]}
    schemas["ResponseFormat"]["then"] = {"required": ["json_schema"], "properties": {"json_schema": {
        "type": "object", "required": ["schema"], "properties": {"schema": {"type": "object"}}}}}
    choice = {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}
    not_blank = {"type": "string", "pattern": r"\S"}
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        set_field(name, "guided_choice", choice)
        set_field(name, "guided_regex", not_blank)
        set_field(name, "guided_grammar", not_blank)
    set_field("StructuredOutputs", "choice", choice)
    set_field("StructuredOutputs", "regex", not_blank)
    set_field("StructuredOutputs", "grammar", not_blank)
    _one_constraint(schemas)
    schemas["TextContentPart"]["properties"]["type"] = {"type": "string", "enum": ["text"]}
    # A message's content may be left out or null (an assistant turn that only calls tools): the templates get "".
    refine_responses_request(schemas, most_tokens)

    tokenize = schemas["TokenizeRequest"]
    set_field("TokenizeRequest", "chat_template_kwargs", template_kwargs)
    messages = {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/ChatMessage"}}
    tokenize["properties"]["messages"] = {"anyOf": [messages, {"type": "null"}]}
    # Exactly one of prompt and messages.
    tokenize["oneOf"] = [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}, "messages": {"type": "null"}}},
        {"required": ["messages"], "properties": {"messages": messages, "prompt": {"type": "null"}}},
    ]
    set_field("DetokenizeRequest", "tokens", {"type": "array", "items": {
        "type": "integer", "minimum": 0, "maximum": tokenizer_vocab_size - 1}}, nullable=False)
