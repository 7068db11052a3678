"""Agent loops of real client libraries against a real `shrike serve` on the default model.

The first turn forces a call (SmolLM2-135M seldom chooses a tool by itself under tool_choice auto);
the second turn sends the assistant message with its tool calls back as each library does (content
null) with the tool's result, and must end in an answer that uses the result. SmolLM2's chat template
prints neither tools nor tool calls: what reaches the model is Shrike's generic tool prompt.
"""
from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from test_server_lifecycle import SERVED_NAME, running_server

RESULT = "It is 12:00 in UTC."
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current time in a time zone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
TOOLS = [TIME_TOOL, WEATHER_TOOL]
QUESTION = "What time is it in UTC?"


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    with running_server(default_model_dir, log, "--dtype", "float32", "--max-num-seqs", "8",
                        "--enable-auto-tool-choice", "--tool-call-parser", "hermes") as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=120)


def _time_tool(calls: list[str]):
    def get_time(timezone: str) -> str:
        """Get the current time in a time zone."""
        calls.append(timezone)
        return RESULT if timezone == "UTC" else f"It is 12:00 in {timezone}."
    return get_time


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_openai_client_tool_loop(client, stream):
    messages = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(model=SERVED_NAME, messages=messages, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=60)
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and message.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_time", {"timezone": "UTC"})]
    messages.append(message)  # as OpenAI's guide does: the SDK object itself, content None
    messages += [{"role": "tool", "tool_call_id": c.id, "content": RESULT} for c in message.tool_calls]
    kwargs = dict(model=SERVED_NAME, messages=messages, tools=TOOLS, temperature=0, max_tokens=40)
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        second = client.chat.completions.create(**kwargs)
        answer, finish = second.choices[0].message.content, [second.choices[0].finish_reason]
    assert finish == ["stop"] and "12:00" in answer


def test_several_calls_in_one_turn_and_missing_content(client):
    calls = [{"id": "call_a", "type": "function", "function": {"name": "get_time", "arguments": '{"timezone": "UTC"}'}},
             {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    messages = [{"role": "user", "content": "Time in UTC and weather in Oslo?"},
                {"role": "assistant", "tool_calls": calls},  # no content key at all
                {"role": "tool", "tool_call_id": "call_a", "content": RESULT},
                {"role": "tool", "tool_call_id": "call_b", "content": "Snow, -3 degrees"}]
    response = client.chat.completions.create(model=SERVED_NAME, messages=messages, tools=TOOLS, temperature=0,
                                              max_tokens=30)
    assert response.choices[0].message.content or response.choices[0].message.tool_calls


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_named_call_cut_by_max_tokens_is_still_a_tool_call(client, stream):
    kwargs = dict(model=SERVED_NAME, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
                  tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=0, max_tokens=4)
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        name, arguments = deltas[0].function.name, "".join(d.function.arguments or "" for d in deltas)
        finish = chunks[-1].choices[0].finish_reason
    else:
        choice = client.chat.completions.create(**kwargs).choices[0]
        content, (call,) = choice.message.content, choice.message.tool_calls
        name, arguments, finish = call.function.name, call.function.arguments, choice.finish_reason
    assert finish == "length" and not content
    assert name == "get_weather" and arguments.startswith('{"city": ')


def test_langchain_agent_tool_loop(server):
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_model_call
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    calls: list[str] = []
    get_time = tool(_time_tool(calls))

    @wrap_model_call
    def first_turn_calls_a_tool(request, handler):
        if not any(isinstance(m, ToolMessage) for m in request.messages):
            request = request.override(tool_choice="required")
        return handler(request)

    for streaming in (False, True):
        model = ChatOpenAI(model=SERVED_NAME, base_url=f"{server.base_url}/v1", api_key="none", temperature=0,
                           max_tokens=60, streaming=streaming, max_retries=0)
        agent = create_agent(model, tools=[get_time], middleware=[first_turn_calls_a_tool])
        messages = agent.invoke({"messages": [{"role": "user", "content": QUESTION}]})["messages"]
        assert [type(m) for m in messages[1:]] == [AIMessage, ToolMessage, AIMessage]
        assert messages[1].tool_calls[0]["args"] == {"timezone": "UTC"}
        assert "12:00" in messages[-1].content and not messages[-1].tool_calls
    assert calls == ["UTC", "UTC"]


def test_langchain_structured_output(server):
    from langchain_openai import ChatOpenAI

    class City(BaseModel):
        name: str
        country: str

    model = ChatOpenAI(model=SERVED_NAME, base_url=f"{server.base_url}/v1", api_key="none", temperature=0,
                       max_tokens=60, max_retries=0)
    for method in ("function_calling", "json_schema"):
        city = model.with_structured_output(City, method=method).invoke("Name a city in France.")
        assert isinstance(city, City) and city.name


def test_pydantic_ai_structured_output(server):
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.settings import ModelSettings

    class City(BaseModel):
        name: str
        country: str

    model = OpenAIChatModel(SERVED_NAME, provider=OpenAIProvider(base_url=f"{server.base_url}/v1", api_key="none"))
    for output_type in (City, NativeOutput(City)):  # a forced output tool, then response_format json_schema
        agent = Agent(model, output_type=output_type, model_settings=ModelSettings(temperature=0, max_tokens=80))
        city = agent.run_sync("Name a city in France.").output
        assert isinstance(city, City) and city.name and city.country


@pytest.fixture(scope="module", params=["llguidance", "xgrammar"])
def backend_client(request, server, default_model_dir, tmp_path_factory):
    if request.param == "llguidance":
        yield openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
        return
    log = tmp_path_factory.mktemp("xgrammar") / "server.log"
    with running_server(default_model_dir, log, "--max-num-seqs", "8",
                        "--structured-outputs-backend", "xgrammar") as other:
        yield openai.OpenAI(base_url=f"{other.base_url}/v1", api_key="none", max_retries=0, timeout=120)


# Strings bounded, so that sampling at temperature 1 ends within max_tokens; additionalProperties absent.
BOUNDED_TOOLS = [{"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "timezone": {"type": "string", "maxLength": 16}}, "required": ["timezone"]}}},
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}]


def _closed(schema: dict) -> dict:
    """The tool's schema with undeclared keys refused (it leaves additionalProperties out, as most do)."""
    return {**schema, "additionalProperties": False}


def test_tool_arguments_never_carry_undeclared_keys(backend_client):
    for seed in (0, 8):  # n=8 samples each: seeds 0-7 and 8-15
        # One call per answer: a list of parallel calls has no bound, which a model at temperature 1 runs into.
        response = backend_client.chat.completions.create(
            model=SERVED_NAME, messages=[{"role": "user", "content": "What time is it, and the weather in Rome?"}],
            tools=BOUNDED_TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=seed, n=8,
            max_tokens=80)
        for choice in response.choices:
            assert choice.finish_reason == "tool_calls", choice.message
            for call in choice.message.tool_calls:
                schema = next(t for t in BOUNDED_TOOLS if t["function"]["name"] == call.function.name)["function"]
                jsonschema.validate(json.loads(call.function.arguments), _closed(schema["parameters"]))


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)
    city: str = Field(max_length=20)


def test_json_schema_outputs_never_carry_undeclared_keys(backend_client):
    schema = Person.model_json_schema()  # no additionalProperties, as pydantic writes it
    assert "additionalProperties" not in schema
    for seed in (0,):  # n=8 samples: seeds 0-7
        response = backend_client.chat.completions.create(
            model=SERVED_NAME, messages=[{"role": "user", "content": "Describe a person."}], temperature=1.0,
            seed=seed, n=8, max_tokens=80,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
        for choice in response.choices:
            assert choice.finish_reason == "stop", choice.message.content
            jsonschema.validate(json.loads(choice.message.content), _closed(schema))


@pytest.mark.parametrize("model_class", ["OpenAIResponsesModel", "OpenAIChatCompletionsModel"])
def test_openai_agents_runner(server, model_class):
    """OpenAIResponsesModel is the SDK's default model class (POST /v1/responses); the other speaks chat completions."""
    import agents
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    calls: list[str] = []
    model = getattr(agents, model_class)(model=SERVED_NAME, openai_client=openai.AsyncOpenAI(
        base_url=f"{server.base_url}/v1", api_key="none", max_retries=0))
    # tool_choice resets to auto after the first call (the SDK's reset_tool_choice), so the loop ends.
    agent = Agent(name="clock", instructions="Answer questions about time.", tools=[function_tool(_time_tool(calls))],
                  model=model, model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=60))

    async def run() -> tuple[str, str]:
        plain = await Runner.run(agent, QUESTION, max_turns=4)
        streamed = Runner.run_streamed(agent, QUESTION, max_turns=4)
        async for _ in streamed.stream_events():
            pass
        return plain.final_output, streamed.final_output

    for answer in asyncio.run(run()):
        assert "12:00" in answer
    assert calls == ["UTC", "UTC"]


RESPONSES_TIME_TOOL = {"type": "function", **TIME_TOOL["function"]}


def test_responses_text_follow_up_format_and_cut(client):
    first = client.responses.create(model=SERVED_NAME, input="What is the capital of France?", temperature=0,
                                    max_output_tokens=30)
    assert first.status == "completed" and "Paris" in first.output_text and first.usage.output_tokens > 0
    follow_up = client.responses.create(model=SERVED_NAME, input="And of Germany?", previous_response_id=first.id,
                                        temperature=0, max_output_tokens=30)
    assert "Berlin" in follow_up.output_text
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}, "required": ["name"]}
    city = client.responses.create(model=SERVED_NAME, input="Name a city.", temperature=0, max_output_tokens=40,
                                   text={"format": {"type": "json_schema", "name": "city", "schema": schema}})
    jsonschema.validate(json.loads(city.output_text), {**schema, "additionalProperties": False})
    cut = client.responses.create(model=SERVED_NAME, input="Tell a story.", temperature=0, max_output_tokens=5)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"


def test_responses_function_call_round_trip_streamed(client):
    with client.responses.stream(model=SERVED_NAME, input=QUESTION, tools=[RESPONSES_TIME_TOOL], tool_choice="required",
                                 temperature=0, max_output_tokens=60) as stream:
        kinds = [event.type for event in stream]
        call = stream.get_final_response().output[-1]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "get_time", {"timezone": "UTC"})
    items = [{"role": "user", "content": QUESTION}, call.model_dump(exclude_none=True),
             {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}]
    answer = client.responses.create(model=SERVED_NAME, tools=[RESPONSES_TIME_TOOL], temperature=0,
                                     max_output_tokens=40, input=items)
    assert "12:00" in answer.output_text


def test_responses_mistakes_are_clear_errors(client, server):
    with pytest.raises(openai.NotFoundError, match="no response 'resp_nope'"):
        client.responses.create(model=SERVED_NAME, input="Hi", previous_response_id="resp_nope")
    with pytest.raises(openai.BadRequestError, match="tools.0.type: Input should be 'function'"):
        client.responses.create(model=SERVED_NAME, input="Hi", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match="input_image"):
        client.responses.create(model=SERVED_NAME, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://x/y.png"}]}])
    assert client.models.retrieve(SERVED_NAME).id == SERVED_NAME
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("nope")


def test_stop_reason_and_include_stop_str_in_output(client):
    # vLLM's fields: the stop string (or stop token id) that ended each choice, and keeping it in the text.
    kwargs = dict(model=SERVED_NAME, prompt="The capital of France is", temperature=0, max_tokens=20, stop=["Paris"])
    plain = client.completions.create(**kwargs).choices[0]
    kept = client.completions.create(**kwargs, extra_body={"include_stop_str_in_output": True}).choices[0]
    assert (plain.text, plain.model_extra["stop_reason"]) == (" ", "Paris")
    assert (kept.text, kept.model_extra["stop_reason"]) == (" Paris", "Paris")
    chat = dict(model=SERVED_NAME, messages=[{"role": "user", "content": "What is the capital of France?"}],
                temperature=0, max_tokens=30, stop=["Paris"])
    answer = client.chat.completions.create(**chat).choices[0]
    assert answer.model_extra["stop_reason"] == "Paris" and "Paris" not in answer.message.content
    last = [c for c in client.chat.completions.create(stream=True, **chat) if c.choices][-1].choices[0]
    assert (last.finish_reason, last.model_extra["stop_reason"]) == ("stop", "Paris")
    unstopped = client.completions.create(**{**kwargs, "stop": None, "max_tokens": 3}).choices[0]
    assert unstopped.finish_reason == "length" and unstopped.model_extra["stop_reason"] is None


def test_logit_bias(client, server):
    paris = httpx.post(f"{server.base_url}/tokenize", json={"prompt": " Paris", "add_special_tokens": False}).json()
    kwargs = dict(model=SERVED_NAME, prompt="The capital of France is", temperature=0, max_tokens=3)
    assert client.completions.create(**kwargs).choices[0].text.startswith(" Paris")
    banned = client.completions.create(**kwargs, logit_bias={str(paris["tokens"][0]): -100}).choices[0].text
    assert not banned.startswith(" Paris")
    with pytest.raises(openai.BadRequestError, match=r"token ids in \[0, 49152\)"):
        client.completions.create(**kwargs, logit_bias={"49152": 1})
