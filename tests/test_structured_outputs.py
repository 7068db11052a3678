"""Structured outputs and tool calling on a real `shrike serve`, through the official openai client."""
from __future__ import annotations

import asyncio
import json
import re
from enum import Enum
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from test_server_lifecycle import SERVED_NAME, running_server

from shrike.server.context import _template_message
from shrike.server.protocol import ChatMessage
from shrike.tokenizer import Tokenizer

ASK = [{"role": "user", "content": "Describe a person, a city and a few numbers."}]


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    # float32, as in test_server_api: greedy text then does not depend on the batch it ran in.
    with running_server(default_model_dir, log, "--dtype", "float32", "--max-num-seqs", "8",
                        "--enable-auto-tool-choice", "--tool-call-parser", "hermes") as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


# Schemas of increasing difficulty. Strings and lists are bounded so that a tiny model finishes within
# max_tokens; everything else (nesting, enums, anyOf, patterns, optional fields) is what clients send.

class Flag(BaseModel):
    ok: bool


class Point(BaseModel):
    x: int = Field(ge=-100, le=100)
    y: int = Field(ge=-100, le=100)


class Colour(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Paint(BaseModel):
    colour: Colour
    litres: float = Field(ge=0, le=10)


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)


class Tags(BaseModel):
    tags: list[Literal["a", "b", "c"]] = Field(min_length=2, max_length=3)


class Code(BaseModel):
    code: str = Field(pattern=r"^[A-Z]{3}-\d{3}$")


class Address(BaseModel):
    city: str = Field(max_length=10)
    zip: str = Field(pattern=r"^\d{5}$")


class Customer(BaseModel):
    person: Person
    address: Address


class Optional_(BaseModel):
    title: str = Field(max_length=10)
    subtitle: str | None = Field(default=None, max_length=10)


class Shape(BaseModel):
    shape: Point | Paint


class Team(BaseModel):
    lead: Person
    members: list[Person] = Field(min_length=1, max_length=2)
    mood: Literal["happy", "sad"]


class Inventory(BaseModel):
    items: list[Paint] = Field(min_length=1, max_length=2)
    where: Address | None
    codes: list[Code] = Field(max_length=1)


SCHEMAS = [Flag, Point, Paint, Person, Tags, Code, Address, Customer, Optional_, Shape, Team, Inventory]


def _strict_schema(model: type[BaseModel]) -> dict:
    """The schema the client sends for the model (what the answer must satisfy)."""
    from openai.lib._pydantic import to_strict_json_schema
    return to_strict_json_schema(model)


@pytest.mark.parametrize("model", SCHEMAS, ids=[m.__name__ for m in SCHEMAS])
def test_parse_returns_a_valid_object(client, model):
    response = client.chat.completions.parse(model=SERVED_NAME, messages=ASK, response_format=model,
                                             max_tokens=160, temperature=0)
    choice = response.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), _strict_schema(model))
    assert isinstance(choice.message.parsed, model)


def test_json_schema_with_n_and_sampling_gives_valid_objects_each(client):
    schema = _strict_schema(Customer)
    response = client.chat.completions.create(
        model=SERVED_NAME, messages=ASK, max_tokens=120, temperature=1.0, seed=7, n=4,
        response_format={"type": "json_schema", "json_schema": {"name": "customer", "schema": schema, "strict": True}})
    for choice in response.choices:
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_on_completions(client):
    response = client.completions.create(model=SERVED_NAME, prompt="A JSON object describing a cat:", max_tokens=60,
                                         temperature=0, extra_body={"response_format": {"type": "json_object"},
                                                                    "structured_outputs": None})
    if response.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(response.choices[0].text), dict)
    else:  # out of tokens: still a JSON object so far
        assert response.choices[0].text.lstrip().startswith("{")


def test_regex_holds_over_many_seeds_at_temperature_one(client):
    pattern = r"[A-Z][a-z]{2,5} (19|20)\d{2}"
    for seed in range(3):
        response = client.completions.create(model=SERVED_NAME, prompt="Name and year:", max_tokens=12, n=8,
                                             temperature=1.0, seed=seed,
                                             extra_body={"structured_outputs": {"regex": pattern}})
        for choice in response.choices:
            assert re.fullmatch(pattern, choice.text), choice.text
            assert choice.finish_reason == "stop"


def test_choice_holds_over_many_seeds_at_temperature_one(client):
    options = ["sunny", "rainy", "a foggy morning"]
    seen = set()
    for seed in range(3):
        response = client.chat.completions.create(model=SERVED_NAME, messages=[{"role": "user", "content": "Weather?"}],
                                                  max_tokens=8, n=8, temperature=1.0, seed=seed,
                                                  extra_body={"structured_outputs": {"choice": options}})
        for choice in response.choices:
            assert choice.message.content in options
            seen.add(choice.message.content)
    assert len(seen) > 1  # sampling still chooses among the options


def test_lark_grammar_and_streaming(client):
    grammar = 'start: "Answer: " NUMBER " apples"\nNUMBER: /[1-9][0-9]?/'
    kwargs = dict(model=SERVED_NAME, messages=[{"role": "user", "content": "How many apples?"}], max_tokens=10,
                  temperature=0, extra_body={"structured_outputs": {"grammar": grammar}})
    plain = client.chat.completions.create(**kwargs).choices[0].message.content
    assert re.fullmatch(r"Answer: [1-9][0-9]? apples", plain)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs)
                       if c.choices)
    assert streamed == plain


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}},
                   "required": ["zone"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
SCHEMA_OF = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def _check_calls(calls: list[tuple[str, str, str]]) -> None:
    """(id, name, arguments) -> each names a tool and its arguments validate against that tool's schema."""
    assert calls
    assert len({call_id for call_id, _, _ in calls}) == len(calls)
    for call_id, name, arguments in calls:
        assert call_id.startswith("chatcmpl-tool-")
        jsonschema.validate(json.loads(arguments), SCHEMA_OF[name])


def _streamed_calls(chunks) -> tuple[list[tuple[str, str, str]], str | None, str]:
    calls: dict[int, list[str]] = {}
    finish, content = None, ""
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, ["", "", ""])
                entry[0] += call.id or ""
                entry[1] += (call.function.name or "") if call.function else ""
                entry[2] += (call.function.arguments or "") if call.function else ""
    return [tuple(calls[i]) for i in sorted(calls)], finish, content


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}],
                         ids=["required", "named"])
def test_forced_tool_calls_validate_streamed_and_not(client, tool_choice):
    kwargs = dict(model=SERVED_NAME, messages=WEATHER_QUESTION, tools=TOOLS, tool_choice=tool_choice, max_tokens=80,
                  temperature=0)
    response = client.chat.completions.create(**kwargs)
    message = response.choices[0].message
    assert response.choices[0].finish_reason == "tool_calls"
    calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls]
    _check_calls(calls)
    if isinstance(tool_choice, dict):
        assert [name for _, name, _ in calls] == ["get_time"]
    streamed, finish, content = _streamed_calls(client.chat.completions.create(stream=True, **kwargs))
    assert finish == "tool_calls" and content == ""
    _check_calls(streamed)
    assert [(n, json.loads(a)) for _, n, a in streamed] == [(n, json.loads(a)) for _, n, a in calls]


def test_required_tool_calls_at_temperature_one_always_validate(client):
    response = client.chat.completions.create(model=SERVED_NAME, messages=WEATHER_QUESTION, tools=TOOLS,
                                              tool_choice="required", max_tokens=100, temperature=1.0, seed=3, n=4)
    for choice in response.choices:
        assert choice.finish_reason == "tool_calls", choice.message.content
        _check_calls([(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls])


# The auto parser on a real output: the model is made to write a Hermes tool call (or a broken one) by a regex.
HERMES_CALL = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
               '\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_auto_tool_choice_parses_what_the_model_wrote(client, stream):
    kwargs = dict(model=SERVED_NAME, messages=WEATHER_QUESTION, tools=TOOLS, tool_choice="auto", max_tokens=80,
                  temperature=0, extra_body={"structured_outputs": {"regex": re.escape(HERMES_CALL)}})
    if stream:
        calls, finish, content = _streamed_calls(client.chat.completions.create(stream=True, **kwargs))
    else:
        response = client.chat.completions.create(**kwargs)
        finish, content = response.choices[0].finish_reason, response.choices[0].message.content
        calls = [(c.id, c.function.name, c.function.arguments) for c in response.choices[0].message.tool_calls]
    assert finish == "tool_calls" and not content
    _check_calls(calls)
    assert [(n, json.loads(a)) for _, n, a in calls] == [("get_weather", {"city": "Paris", "unit": "celsius"}),
                                                         ("get_time", {"zone": "CET"})]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_malformed_tool_call_comes_back_as_content(client, stream):
    broken = '<tool_call>\n{"name": get_weather, "arguments": {}}\n</tool_call>'
    kwargs = dict(model=SERVED_NAME, messages=WEATHER_QUESTION, tools=TOOLS, max_tokens=40, temperature=0,
                  extra_body={"structured_outputs": {"regex": re.escape(broken)}})
    if stream:
        calls, finish, content = _streamed_calls(client.chat.completions.create(stream=True, **kwargs))
    else:
        response = client.chat.completions.create(**kwargs)
        calls, finish = response.choices[0].message.tool_calls, response.choices[0].finish_reason
        content = response.choices[0].message.content
    assert not calls and finish == "stop" and content == broken


def test_tool_turns_reach_the_chat_template(http, default_model_dir):
    messages = [*WEATHER_QUESTION,
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"}]
    # SmolLM2's own template needs a content on every message.
    plain = [{**m, "content": m["content"] or ""} for m in messages]
    ids = http.post("/tokenize", json={"messages": plain, "add_generation_prompt": False}).json()["tokens"]
    assert "18 degrees" in http.post("/detokenize", json={"tokens": ids}).json()["prompt"]
    # What a tool-aware template sees: arguments as an object (as transformers passes them) and the call id.
    template = ("{% for m in messages %}{{ m.role }}:{{ m.content or '' }}"
                "{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments.city }}{% endif %}"
                "{% if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %}|{% endfor %}")
    converted = [_template_message(ChatMessage(**m), i) for i, m in enumerate(messages)]
    rendered = Tokenizer(default_model_dir, chat_template=template).apply_chat_template(
        converted, add_generation_prompt=False)
    assert rendered == "user:What is the weather in Paris?|assistant:Paris|tool:18 degrees[call_1]|"


BAD_REQUESTS = [
    ("schema type", "/v1/chat/completions",
     {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
     "response_format", "strin"),
    ("schema unsupported keyword", "/v1/chat/completions",
     {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "null"}}}}},
     "response_format", "not"),
    ("schema missing", "/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format", "json_schema.schema"),
    ("dangling $ref", "/v1/completions", {"structured_outputs": {"json": {"$ref": "#/$defs/nope"}}},
     "structured_outputs", "nope"),
    ("regex", "/v1/completions", {"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs", "regex"),
    ("lark grammar", "/v1/chat/completions", {"structured_outputs": {"grammar": "start: undefined_rule"}},
     "structured_outputs", "undefined_rule"),
    ("two constraints", "/v1/completions", {"structured_outputs": {"regex": "a", "choice": ["a"]}},
     "structured_outputs", "exactly one"),
    ("empty choice", "/v1/completions", {"structured_outputs": {"choice": []}}, "structured_outputs", "non-empty"),
    ("json not JSON", "/v1/completions", {"structured_outputs": {"json": "{not json"}}, "structured_outputs",
     "not valid JSON"),
    ("unknown tool", "/v1/chat/completions", {"tools": TOOLS, "tool_choice": {"type": "function",
                                                                            "function": {"name": "nope"}}},
     "tool_choice", "nope"),
    ("tool_choice without tools", "/v1/chat/completions", {"tool_choice": "required"}, "tool_choice", "tools"),
    ("bad tool schema", "/v1/chat/completions",
     {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}],
      "tool_choice": "required"}, "tools", "objekt"),
    ("tool and format", "/v1/chat/completions",
     {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "leave out"),
]


@pytest.mark.parametrize("path, extra, param, words", [case[1:] for case in BAD_REQUESTS],
                         ids=[case[0] for case in BAD_REQUESTS])
def test_bad_constraints_are_400s_naming_the_field(http, path, extra, param, words):
    body = {"model": SERVED_NAME, "max_tokens": 4, **extra}
    body.update({"messages": WEATHER_QUESTION} if "chat" in path else {"prompt": "Hi"})
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_constrained_and_unconstrained_requests_batched_behave_as_alone(server):
    schema = _strict_schema(Person)
    requests = [
        {"messages": ASK, "max_tokens": 40, "temperature": 0,
         "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}},
        {"messages": ASK, "max_tokens": 24, "temperature": 0},
        {"messages": WEATHER_QUESTION, "max_tokens": 60, "temperature": 0, "tools": TOOLS, "tool_choice": "required"},
        {"messages": WEATHER_QUESTION, "max_tokens": 24, "temperature": 0, "frequency_penalty": 0.5},
    ]

    async def ask(client: openai.AsyncOpenAI, body: dict):
        response = await client.chat.completions.create(model=SERVED_NAME, **body)
        message = response.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
        return message.content, calls, response.choices[0].finish_reason

    async def run():
        async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0,
                                      timeout=120) as client:
            alone = [await ask(client, body) for body in requests]
            together = await asyncio.gather(*[ask(client, body) for body in requests])
            return alone, together

    alone, together = asyncio.run(run())
    assert together == alone
    jsonschema.validate(json.loads(alone[0][0]), schema)
