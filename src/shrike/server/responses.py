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
from pydantic import ValidationError
from starlette.responses import Response

from shrike.server.chat import create_chat_completion
from shrike.server.context import ServerContext
from shrike.server.errors import APIError, bad_request
from shrike.server.generation import GenerationStream
from shrike.server.protocol import ChatCompletionRequest, ResponsesRequest
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
    items = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    for index, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item.get("role", "user"), "content": _item_text(item.get("content"), index)})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else _item_text(output, index)})
        elif kind == "reasoning":
            continue  # a model's earlier reasoning is not shown to it again, as chat templates drop it
        else:
            raise bad_request(f"input.{index}: items of type {kind!r} are not supported (message, function_call, "
                              "function_call_output and reasoning are)", "input")
    return messages


def _item_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    texts = [part.get("text") for part in parts if isinstance(part, dict)
             and part.get("type") in ("input_text", "output_text", "text", "refusal")]
    not_text = [part.get("type") if isinstance(part, dict) else type(part).__name__ for part in parts
                if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text", "refusal")]
    if not_text or any(not isinstance(t, str) for t in texts) or not isinstance(content, list):
        found = f", got {not_text[0]!r}" if not_text else ""
        raise bad_request(f"input.{index}.content: only text is supported (a string or input_text / output_text "
                          f"parts){found}", "input")
    return "".join(texts)


def chat_request(body: ResponsesRequest, messages: list[dict]) -> ChatCompletionRequest:
    fields: dict[str, Any] = {"messages": messages, "stream": body.stream,
                              "stream_options": {"include_usage": True} if body.stream else None,
                              "temperature": body.temperature, "top_p": body.top_p,
                              "max_completion_tokens": body.max_output_tokens,
                              "parallel_tool_calls": body.parallel_tool_calls}
    if body.model is not None:
        fields["model"] = body.model
    tools = [_chat_tool(tool, i) for i, tool in enumerate(body.tools or [])]
    if tools:
        fields["tools"] = tools
    if body.tool_choice is not None:
        fields["tool_choice"] = _chat_tool_choice(body.tool_choice)
    text_format = (body.text or {}).get("format")
    if text_format is not None and not isinstance(text_format, dict):
        raise bad_request('text.format must be an object such as {"type": "json_schema", "name": ..., "schema": '
                          '{...}}', "text")
    if text_format and text_format.get("type") != "text":
        fields["response_format"] = _chat_response_format(text_format)
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as e:
        error = e.errors()[0]
        raise bad_request(f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}", "input") from None


def _chat_tool(tool: dict, index: int) -> dict:
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        raise bad_request(f"tools.{index}: only function tools are supported ({{\"type\": \"function\", \"name\": "
                          "..., \"parameters\": {...}}})", "tools")
    return {"type": "function", "function": {key: tool[key] for key in ("name", "description", "parameters")
                                             if tool.get(key) is not None}}


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _chat_response_format(text_format: dict) -> dict:
    if text_format.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": text_format.get("name", "response"),
                                                       "schema": text_format.get("schema"),
                                                       "strict": text_format.get("strict")}}
    return {"type": text_format.get("type")}


def response_skeleton(body: ResponsesRequest, response_id: str, model: str) -> dict:
    """The response object before any output: what response.created carries."""
    return {"id": response_id, "object": "response", "created_at": int(time.time()), "status": "in_progress",
            "model": model, "output": [], "error": None, "incomplete_details": None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "parallel_tool_calls": body.parallel_tool_calls, "previous_response_id": body.previous_response_id,
            "temperature": body.temperature, "top_p": body.top_p, "tool_choice": body.tool_choice or "auto",
            "tools": body.tools or [], "text": body.text or {"format": {"type": "text"}}, "truncation": "disabled",
            "metadata": body.metadata or {}, "usage": None}
