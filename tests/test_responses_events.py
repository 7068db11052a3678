"""Chat chunks retold as Responses events: reasoning, text and calls each one output item, in the model's order."""
from __future__ import annotations

import asyncio
import json

from shrike.server.responses_items import output_items
from shrike.server.responses_stream import ResponseEvents

SKELETON = {"id": "resp_1", "object": "response", "status": "in_progress", "output": [], "usage": None}


def _sse(*chunks: dict) -> list[str]:
    return [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks] + ["data: [DONE]\n\n"]


def _delta(finish: str | None = None, **delta) -> dict:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


async def _aiter(lines: list[str]):
    for line in lines:
        yield line


def _events(lines: list[str]) -> tuple[list[dict], list[dict]]:
    stored: list[dict] = []

    async def run() -> list[dict]:
        return [event async for event in ResponseEvents(SKELETON, stored.extend).translate(_aiter(lines))]

    return asyncio.run(run()), stored


def test_reasoning_text_and_a_call_become_three_items_in_order():
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": ""}}
    events, stored = _events(_sse(
        _delta(role="assistant", content=""), _delta(reasoning_content="Think"), _delta(reasoning_content="ing."),
        _delta(content="Let me look."), _delta(tool_calls=[call]),
        _delta(tool_calls=[{"index": 0, "function": {"arguments": '{"timezone": '}}]),
        _delta("tool_calls", tool_calls=[{"index": 0, "function": {"arguments": '"UTC"}'}}]),
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}}))
    kinds = [event["type"] for event in events]
    assert kinds == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["usage"]["output_tokens"] == 9
    reasoning, message, function_call = final["output"]
    assert reasoning["content"][0]["text"] == "Thinking." and message["content"][0]["text"] == "Let me look."
    assert (function_call["call_id"], function_call["arguments"]) == ("call_1", '{"timezone": "UTC"}')
    assert stored == final["output"]  # what previous_response_id continues from


def test_a_cut_answer_completes_as_incomplete_and_an_error_ends_the_stream():
    events, _ = _events(_sse(_delta(content="Once upon"), _delta("length", content=" a time")))
    assert events[-1]["response"]["status"] == "incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    error = {"error": {"message": "the engine failed", "type": "server_error", "param": None,
                       "code": "engine_step_failed"}}
    events, stored = _events([f"data: {json.dumps(error)}\n\n"])
    assert events[-1]["type"] == "error" and events[-1]["code"] == "engine_step_failed" and not stored


def test_a_whole_message_becomes_the_same_items():
    items = output_items({"role": "assistant", "reasoning_content": "Hmm.", "content": "Noon.", "tool_calls": [
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]})
    assert [item["type"] for item in items] == ["reasoning", "message", "function_call"]
