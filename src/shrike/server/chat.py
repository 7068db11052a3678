"""POST /v1/chat/completions."""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response

from shrike.engine.async_engine import Generation
from shrike.sampling.sampler import TokenLogprobs
from shrike.server.context import ServerContext
from shrike.server.errors import bad_request
from shrike.server.generation import ChoiceText, outputs_until_disconnect, stream_events, submit, usage
from shrike.server.logprobs import chat_logprobs, shown_logprobs
from shrike.server.protocol import ChatCompletionRequest
from shrike.server.sampling import build_sampling_params

PARAM_NAMES = set(ChatCompletionRequest.model_fields)


def _reject_unsupported(body: ChatCompletionRequest) -> None:
    if body.response_format is not None and body.response_format.type != "text":
        raise bad_request(f"response_format {body.response_format.type!r} is not supported yet: this server has no "
                          "guided decoding; ask for JSON in the prompt and leave response_format out",
                          "response_format")
    if body.tools and body.tool_choice not in (None, "none", "auto"):
        raise bad_request("tool_choice 'required' or a named tool is not supported: this server returns tool calls "
                          "as plain text; use 'auto' or 'none'", "tool_choice")
    if body.top_logprobs is not None and not body.logprobs:
        raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")


async def create_chat_completion(body: ChatCompletionRequest, request: Request, ctx: ServerContext) -> Response:
    ctx.check_model(body.model)
    _reject_unsupported(body)
    tools = body.tools if body.tools and body.tool_choice != "none" else None
    prompt_ids = ctx.encode_chat(body.messages, body.add_generation_prompt, tools, body.chat_template_kwargs)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    # Without max_tokens a chat answer may use the rest of the context, as in vLLM.
    params = build_sampling_params(body, ctx.defaults, max_tokens, None, (body.top_logprobs or 0) if body.logprobs
                                   else None, None, ctx.max_num_seqs, ctx.vocab_size)
    generation = await submit(ctx, [prompt_ids], params, PARAM_NAMES, "messages")
    response_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        events = _chunks(ctx, generation, response_id, created, len(prompt_ids), include_usage)
        return StreamingResponse(stream_events(generation, events), media_type="text/event-stream",
                                 background=BackgroundTask(generation.close))
    outputs = await outputs_until_disconnect(generation, request)
    if outputs is None:
        return Response(status_code=499)  # nobody is listening; the status only reaches the access log
    choices = [ChoiceText() for _ in range(params.n)]
    for output in outputs:
        for delta in output.deltas:
            choice = choices[delta.index]
            choice.text += delta.text
            choice.num_tokens += len(delta.token_ids)
            choice.logprobs += shown_logprobs(delta, params, ctx.tokenizer.eos_token_ids)
            choice.finish_reason = delta.finish_reason or choice.finish_reason
    completion_tokens = sum(c.num_tokens for c in choices)
    return JSONResponse({
        "id": response_id, "object": "chat.completion", "created": created, "model": ctx.model_name,
        "choices": [{"index": i, "message": {"role": "assistant", "content": c.text},
                     "logprobs": _logprobs(ctx, c.logprobs) if body.logprobs else None,
                     "finish_reason": c.finish_reason} for i, c in enumerate(choices)],
        "usage": usage(len(prompt_ids), completion_tokens),
    })


async def _chunks(ctx: ServerContext, generation: Generation, response_id: str, created: int,
                  num_prompt_tokens: int, include_usage: bool) -> AsyncIterator[dict]:
    want_logprobs = generation.params.logprobs is not None

    def chunk(choices: list[dict]) -> dict:
        event = {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": ctx.model_name,
                 "choices": choices}
        if include_usage:
            event["usage"] = None
        return event

    yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                 for i in range(generation.params.n)])
    completion_tokens = 0
    async for output in generation:
        choices = []
        for delta in output.deltas:
            completion_tokens += len(delta.token_ids)
            if not delta.text and delta.finish_reason is None and not want_logprobs:
                continue  # bytes of a character still incomplete, or text held back as a possible stop string
            choices.append({"index": delta.index, "delta": {"content": delta.text} if delta.text else {},
                            "logprobs": _logprobs(ctx, shown_logprobs(delta, generation.params,
                                                                      ctx.tokenizer.eos_token_ids))
                            if want_logprobs else None,
                            "finish_reason": delta.finish_reason})
        if choices:
            yield chunk(choices)
    if include_usage:
        yield {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": ctx.model_name,
               "choices": [], "usage": usage(num_prompt_tokens, completion_tokens)}


def _logprobs(ctx: ServerContext, entries: list[TokenLogprobs]) -> dict:
    return chat_logprobs(ctx.token_bytes, entries)
