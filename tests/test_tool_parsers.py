"""Each tool-call parser on hand-written model outputs, whole and streamed in small pieces, malformed ones included."""
from __future__ import annotations

import json

import pytest

from shrike.server.tools import BUILTIN_TOOL_PARSERS, build_server_registry
from shrike.server.tools.forced import NamedToolParser, RequiredToolParser
from shrike.server.tools.stream import ToolCallStream

WEATHER = ("get_weather", {"city": "Paris", "days": 3})
TIME = ("get_time", {"zone": "CET"})
NESTED = ("plan", {"steps": [{"do": "a } b", "n": 1.5}, None, True], "note": "quote \" and ;"})

# (parser, model output, expected content, expected calls)
CASES = [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
               '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>',
     "Let me check.", [WEATHER, TIME]),
    ("hermes", '<tool_call>{"name": "plan", "arguments": ' + json.dumps(NESTED[1]) + '}</tool_call>', None, [NESTED]),
    ("hermes", "No tools needed: 2 < 3 and <tool is not a tag.", "No tools needed: 2 < 3 and <tool is not a tag.", []),
    ("hermes", "<tool_call>\nget_weather(Paris)\n</tool_call>", "<tool_call>\nget_weather(Paris)\n</tool_call>", []),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', []),
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; '
                    '{"name": "get_time", "parameters": {"zone": "CET"}}', None, [WEATHER, TIME]),
    ("llama3_json", '<|python_tag|>{"name": "plan", "parameters": ' + json.dumps(NESTED[1]) + "}", None, [NESTED]),
    ("llama3_json", '{"answer": 42}', '{"answer": 42}', []),
    ("llama3_json", "Paris is sunny.", "Paris is sunny.", []),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}} and more',
     '{"name": "get_weather", "parameters": {"city": "Paris"}} and more', []),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
                '{"name": "get_time", "arguments": {"zone": "CET"}}]', None, [WEATHER, TIME]),
    ("mistral", 'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}[TOOL_CALLS]get_time[ARGS]'
                '{"zone": "CET"}', "Sure.", [WEATHER, TIME]),
    ("mistral", "[TOOL_CALLS][{\"name\": ", "[TOOL_CALLS][{\"name\": ", []),
    ("mistral", "[TOOL_CALLS]get weather[ARGS]{}", "[TOOL_CALLS]get weather[ARGS]{}", []),
    ("pythonic", '[get_weather(city="Paris", days=3), get_time(zone=\'CET\')]', None, [WEATHER, TIME]),
    ("pythonic", "<|python_start|>[plan(steps=[{'do': 'a } b', 'n': 1.5}, None, True], note='quote \" and ;')]"
                 "<|python_end|>", None, [NESTED]),
    ("pythonic", "[1, 2, 3]", "[1, 2, 3]", []),
    ("pythonic", "[get_weather(city=os.system('x'))]", "[get_weather(city=os.system('x'))]", []),
    ("pythonic", "[get_weather(city='Par", "[get_weather(city='Par", []),
    ("pythonic", "It is sunny.", "It is sunny.", []),
]


def _calls(calls) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("name, output, content, expected", CASES)
def test_whole_output(name, output, content, expected):
    parser = BUILTIN_TOOL_PARSERS[name]()
    got_content, calls = parser.extract(output)
    assert _calls(calls) == [(n, a) for n, a in expected]
    assert got_content == content
    assert len({c.id for c in calls}) == len(calls)


def _stream(parser, output: str, piece: int) -> tuple[str, list[tuple[str, str, str]]]:
    stream = ToolCallStream(parser)
    deltas = []
    for i in range(0, len(output), piece):
        deltas += stream.push(output[i:i + piece])
    deltas += stream.finish()
    content, calls = "", {}
    for delta in deltas:
        content += delta.get("content", "")
        for call in delta.get("tool_calls", []):
            entry = calls.setdefault(call["index"], ["", "", ""])
            entry[0] += call.get("id", "")
            entry[1] += call["function"].get("name", "")
            entry[2] += call["function"].get("arguments", "")
    return content, [tuple(calls[i]) for i in sorted(calls)]


@pytest.mark.parametrize("piece", [1, 3, 1000])
@pytest.mark.parametrize("name, output, content, expected", CASES)
def test_streamed_output(name, output, content, expected, piece):
    streamed_content, calls = _stream(BUILTIN_TOOL_PARSERS[name](), output, piece)
    if expected:
        # Each call's argument deltas concatenate to valid JSON with the same value.
        assert [(n, json.loads(a)) for _, n, a in calls] == [(n, a) for n, a in expected]
        assert all(call_id for call_id, _, _ in calls)
        assert streamed_content.strip() == (content or "")
    elif calls:
        # The output went wrong after a call had begun streaming: what went out is that call, either whole
        # (valid JSON) or cut off mid-argument at the end of the output.
        for _, name, arguments in calls:
            assert name in output and arguments in output
            if not output.endswith(("Par", "Par'")):
                json.loads(arguments)
    else:
        assert streamed_content == output


def test_forced_formats():
    named = NamedToolParser("get_time")
    assert _calls(named.extract(' {"zone": "CET"}')[1]) == [TIME]
    # Cut off by max_tokens: still the forced call, with the arguments written so far (as vLLM returns it).
    assert [(c.name, c.arguments) for c in named.extract('{"zone": "CE')[1]] == [("get_time", '{"zone": "CE')]
    required = RequiredToolParser()
    output = '[{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}, ' \
             '{"name": "get_time", "parameters": {"zone": "CET"}}]'
    assert _calls(required.extract(output)[1]) == [WEATHER, TIME]
    _, calls = _stream(required, output, 2)
    assert [(n, json.loads(a)) for _, n, a in calls] == [WEATHER, TIME]
    content, cut = required.extract(output[:90])
    assert content is None and [(c.name, c.arguments) for c in cut] == [("get_weather", '{"city": "Paris", "days": 3}'),
                                                                        ("get_time", "")]


def test_parsers_come_from_the_registry_and_unknown_names_are_refused():
    registry = build_server_registry(environ={"SHRIKE_PLUGINS": ""})
    for name, parser in BUILTIN_TOOL_PARSERS.items():
        assert registry.tool_parser(name).target is parser
    assert "hermes" in registry.describe()["tool_parser"]
    with pytest.raises(Exception, match="tool call parser 'nope' is not supported.*hermes"):
        registry.tool_parser("nope")


@pytest.mark.parametrize("name", list(BUILTIN_TOOL_PARSERS))
def test_absurdly_nested_output_is_content_not_a_crash(name):
    output = {"hermes": '<tool_call>{"name": "f", "arguments": ' + "[" * 50000 + "}</tool_call>",
              "llama3_json": '{"name": "f", "parameters": ' + "[" * 50000,
              "mistral": '[TOOL_CALLS][{"name": "f", "arguments": ' + "[" * 50000,
              "pythonic": "[f(a=" + "[" * 50000 + ")]"}[name]
    assert BUILTIN_TOOL_PARSERS[name]().extract(output) == (output, [])
    _stream(BUILTIN_TOOL_PARSERS[name](), output, 5000)  # streamed, it must not raise either
