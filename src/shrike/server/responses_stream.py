"""Streamed /v1/responses: the chat endpoint's chunks retold as Responses events.

Reasoning, text and each function call become output items, opened (output_item.added), grown by
deltas and closed (…done, output_item.done) in the order the model wrote them; the stream starts
with response.created / response.in_progress and ends with response.completed, which carries the whole
response (status "incomplete" when max_output_tokens cut it).
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from shrike.server.responses_items import (finished_response, function_call_item, message_item, new_item_id,
                                           reasoning_item)


class _OpenItem:
    def __init__(self, kind: str, index: int, item_id: str, call_id: str = "", name: str = ""):
        self.kind, self.index, self.id, self.call_id, self.name = kind, index, item_id, call_id, name
        self.text = ""

    def item(self, status: str) -> dict:
        if self.kind == "reasoning":
            return reasoning_item(self.id, self.text, status)
        if self.kind == "message":
            return message_item(self.id, self.text, status)
        return function_call_item(self.id, self.call_id, self.name, self.text, status)


class ResponseEvents:
    def __init__(self, skeleton: dict, on_done: Callable[[list[dict]], None]):
        self.skeleton, self.on_done = skeleton, on_done
        self.sequence = 0
        self.items: list[dict] = []
        self.open: _OpenItem | None = None
        self.finish_reason: str | None = None
        self.usage: dict | None = None

    async def translate(self, chat_sse: AsyncIterator[str]) -> AsyncIterator[dict]:
        yield self._event("response.created", response=self.skeleton)
        yield self._event("response.in_progress", response=self.skeleton)
        try:
            async for line in chat_sse:
                data = line.removeprefix("data: ").strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    error = chunk["error"]
                    yield self._event("error", code=error.get("code"), message=error.get("message"),
                                      param=error.get("param"))
                    return
                for event in self._chunk_events(chunk):
                    yield event
        finally:
            await chat_sse.aclose()
        for event in self._close():
            yield event
        response = finished_response(self.skeleton, self.items, self.finish_reason, self.usage)
        self.on_done(self.items)
        # Also when max_output_tokens cut it (status "incomplete"), as vLLM does: the openai client's stream helper
        # takes the final response from response.completed only.
        yield self._event("response.completed", response=response)

    def _chunk_events(self, chunk: dict) -> list[dict]:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        events = []
        for choice in chunk.get("choices", []):
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                events += self._grow("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                events += self._grow("message", delta["content"])
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                if call.get("id"):
                    events += self._close()
                    events += self._open(_OpenItem("function_call", len(self.items), new_item_id("fc"), call["id"],
                                                   function.get("name") or ""))
                if function.get("arguments"):
                    events += self._grow("function_call", function["arguments"])
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        return events

    def _grow(self, kind: str, text: str) -> list[dict]:
        events = []
        if self.open is None or self.open.kind != kind:
            events += self._close()
            prefix = {"reasoning": "rs", "message": "msg"}[kind]
            events += self._open(_OpenItem(kind, len(self.items), new_item_id(prefix)))
        item = self.open
        item.text += text
        where = {"item_id": item.id, "output_index": item.index}
        if kind == "reasoning":
            events.append(self._event("response.reasoning_text.delta", **where, content_index=0, delta=text))
        elif kind == "message":
            events.append(self._event("response.output_text.delta", **where, content_index=0, delta=text,
                                      logprobs=[]))
        else:
            events.append(self._event("response.function_call_arguments.delta", **where, delta=text))
        return events

    def _open(self, item: _OpenItem) -> list[dict]:
        self.open = item
        events = [self._event("response.output_item.added", output_index=item.index, item=item.item("in_progress"))]
        if item.kind == "message":
            events.append(self._event("response.content_part.added", item_id=item.id, output_index=item.index,
                                      content_index=0, part=_text_part("")))
        return events

    def _close(self) -> list[dict]:
        item, self.open = self.open, None
        if item is None:
            return []
        where = {"item_id": item.id, "output_index": item.index}
        if item.kind == "reasoning":
            events = [self._event("response.reasoning_text.done", **where, content_index=0, text=item.text)]
        elif item.kind == "message":
            events = [self._event("response.output_text.done", **where, content_index=0, text=item.text, logprobs=[]),
                      self._event("response.content_part.done", **where, content_index=0,
                                  part=_text_part(item.text))]
        else:
            events = [self._event("response.function_call_arguments.done", **where, name=item.name,
                                  arguments=item.text)]
        done = item.item("completed")
        self.items.append(done)
        events.append(self._event("response.output_item.done", output_index=item.index, item=done))
        return events

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
