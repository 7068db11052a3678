"""Responses API output items (reasoning, message, function_call) and the finished response object."""
from __future__ import annotations

import uuid


def finished_response(skeleton: dict, output: list[dict], finish_reason: str | None, usage: dict | None) -> dict:
    cut = finish_reason == "length"
    return {**skeleton, "status": "incomplete" if cut else "completed", "output": output,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "usage": None if usage is None else {
                "input_tokens": usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage["total_tokens"]}}


def output_items(message: dict) -> list[dict]:
    """A chat answer's message -> Responses output items: reasoning, then the text, then each function call."""
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(new_item_id("rs"), message["reasoning_content"]))
    if message.get("content"):
        items.append(message_item(new_item_id("msg"), message["content"]))
    for call in message.get("tool_calls") or []:
        items.append(function_call_item(new_item_id("fc"), call["id"], call["function"]["name"],
                                        call["function"]["arguments"]))
    return items


def output_messages(items: list[dict]) -> list[dict]:
    """Output items -> the chat messages a later turn (previous_response_id) continues from."""
    text = "".join(part["text"] for item in items if item["type"] == "message" for part in item["content"])
    calls = [{"id": item["call_id"], "type": "function",
              "function": {"name": item["name"], "arguments": item["arguments"]}}
             for item in items if item["type"] == "function_call"]
    message: dict = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return [message]


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if text or
            status == "completed" else []}


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}
