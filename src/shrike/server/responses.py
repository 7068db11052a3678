"""POST /v1/responses: OpenAI's Responses API (what the OpenAI Agents SDK uses by default), as vLLM serves it.

A Responses request is a chat request in other words: its input items become chat messages, its
function tools and text.format become tools and response_format, and the answer (reasoning, text
and function calls) comes back as output items. Generation goes through the chat endpoint, so
templates, tool calling and structured outputs behave exactly as in /v1/chat/completions.
Responses are kept in memory for `previous_response_id` while the server runs (the newest ones, a
bounded number).
"""
from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

from shrike.server.chat import create_chat_completion
from shrike.server.context import ServerContext
from shrike.server.errors import APIError, bad_request
from shrike.server.generation import GenerationStream
from shrike.server.protocol import (ChatCompletionRequest, ResponsesFunctionCall, ResponsesFunctionCallOutput,
                                    ResponsesMessage, ResponsesNamedToolChoice, ResponsesReasoning, ResponsesRequest)
from shrike.server.responses_items import finished_response, output_items, output_messages
from shrike.server.responses_stream import ResponseEvents

STORED_RESPONSES = 1000  # previous_response_id reaches back this many responses


class ResponseStore:
    """Each stored response's whole conversation as chat messages (its input, then its output)."""

    def __init__(self, capacity: int = STORED_RESPONSES):
        self._conversations: OrderedDict[str, list[dict]] = OrderedDict()
        self._capacity = capacity

    def conversation(self, response_id: str) -> list[dict]:
        if response_id not in self._conversations:
            raise APIError(f"no response {response_id!r} is stored on this server (responses are kept in memory, "
                           f"the newest {self._capacity}, until it restarts)", 404, param="previous_response_id")
        return list(self._conversations[response_id])

    def put(self, response_id: str, conversation: list[dict]) -> None:
        self._conversations[response_id] = conversation
        while len(self._conversations) > self._capacity:
            self._conversations.popitem(last=False)


def install_responses(app: FastAPI, ctx: ServerContext) -> None:
    store = ResponseStore()

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        return await create_response(body, request, ctx, store)


async def create_response(body: ResponsesRequest, request: Request, ctx: ServerContext,
                          store: ResponseStore) -> Response:
    history = store.conversation(body.previous_response_id) if body.previous_response_id else []
    messages = history + input_messages(body)
    chat = chat_request(body, messages)
    response_id = f"resp_{uuid.uuid4().hex}"
    skeleton = response_skeleton(body, response_id, ctx.model_name)
    answer = await create_chat_completion(chat, request, ctx)
    if isinstance(answer, GenerationStream):
        events = ResponseEvents(skeleton, lambda output: store.put(response_id, messages + output_messages(output)))
        return GenerationStream(answer.generation, events.translate(answer.body_iterator))
    if not isinstance(answer, JSONResponse):
        return answer  # the client went away
    completion = json.loads(answer.body)
    choice = completion["choices"][0]
    output = output_items(choice["message"])
    store.put(response_id, messages + output_messages(output))
    return JSONResponse(finished_response(skeleton, output, choice["finish_reason"], completion["usage"]))


def input_messages(body: ResponsesRequest) -> list[dict]:
    """instructions and input items -> chat messages; consecutive function calls form one assistant turn."""
    messages: list[dict] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    items = [ResponsesMessage(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    if all(isinstance(item, ResponsesReasoning) for item in items):
        raise bad_request("input has only reasoning items: give a message or a function call output to answer",
                          "input")
    for item in items:
        if isinstance(item, ResponsesMessage):
            messages.append({"role": item.role, "content": _text(item.content)})
        elif isinstance(item, ResponsesFunctionCall):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, ResponsesFunctionCallOutput):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
        # Reasoning items: a model's earlier reasoning is not shown to it again, as chat templates drop it.
    return messages


def _text(content: str | list) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def chat_request(body: ResponsesRequest, messages: list[dict]) -> ChatCompletionRequest:
    fields: dict[str, Any] = {"messages": messages, "stream": body.stream,
                              "stream_options": {"include_usage": True} if body.stream else None,
                              "temperature": body.temperature, "top_p": body.top_p,
                              "max_completion_tokens": body.max_output_tokens,
                              "parallel_tool_calls": body.parallel_tool_calls, "model": body.model}
    if body.tools:
        fields["tools"] = [{"type": "function", "function": tool.model_dump(
            include={"name", "description", "parameters"}, exclude_none=True)} for tool in body.tools]
    if isinstance(body.tool_choice, ResponsesNamedToolChoice):
        fields["tool_choice"] = {"type": "function", "function": {"name": body.tool_choice.name}}
    else:
        fields["tool_choice"] = body.tool_choice
    text_format = body.text.format if body.text is not None else None
    if text_format is not None and text_format.type == "json_schema":
        if text_format.schema_ is None:
            raise bad_request("text.format: type json_schema needs a schema (a JSON schema object)", "text")
        fields["response_format"] = {"type": "json_schema", "json_schema": {
            "name": text_format.name, "schema": text_format.schema_, "strict": text_format.strict}}
    elif text_format is not None and text_format.type == "json_object":
        fields["response_format"] = {"type": "json_object"}
    return ChatCompletionRequest.model_validate({k: v for k, v in fields.items() if v is not None})


def response_skeleton(body: ResponsesRequest, response_id: str, model: str) -> dict:
    """The response object before any output: what response.created carries."""
    return {"id": response_id, "object": "response", "created_at": int(time.time()), "status": "in_progress",
            "model": model, "output": [], "error": None, "incomplete_details": None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "parallel_tool_calls": body.parallel_tool_calls, "previous_response_id": body.previous_response_id,
            "temperature": body.temperature, "top_p": body.top_p,
            "tool_choice": body.tool_choice.model_dump() if isinstance(body.tool_choice, ResponsesNamedToolChoice)
            else body.tool_choice or "auto",
            "tools": [tool.model_dump(exclude_none=True) for tool in body.tools or []],
            "text": body.text.model_dump(by_alias=True, exclude_none=True) if body.text is not None and
            body.text.format is not None else {"format": {"type": "text"}}, "truncation": "disabled",
            "metadata": body.metadata or {}, "usage": None}
