"""POST /v1/chat/completions."""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi.responses import JSONResponse
from starlette.requests import Request
from starlette.responses import Response

from shrike.engine.async_engine import Generation
from shrike.sampling.sampler import TokenLogprobs
from shrike.server.chat_stream import ChoiceDeltas
from shrike.server.context import ServerContext
from shrike.server.errors import bad_request
from shrike.server.generation import ChoiceText, GenerationStream, outputs_until_disconnect, submit, usage
from shrike.server.logprobs import chat_logprobs, shown_logprobs
from shrike.server.protocol import ChatCompletionRequest
from shrike.server.reasoning import CLOSE, AfterReasoning, ReasoningParser
from shrike.server.sampling import build_sampling_params
from shrike.server.structured import compile_grammar, requested_grammar
from shrike.server.tool_choice import plan_tools
from shrike.server.tools.base import ToolParser

PARAM_NAMES = set(ChatCompletionRequest.model_fields)


def _reject_unsupported(body: ChatCompletionRequest) -> None:
    if body.top_logprobs is not None and not body.logprobs:
        raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")


async def create_chat_completion(body: ChatCompletionRequest, request: Request, ctx: ServerContext) -> Response:
    lora = ctx.check_model(body.model)
    _reject_unsupported(body)
    plan = plan_tools(body, ctx)
    grammar = requested_grammar(body)
    if plan.grammar is not None and grammar is not None:
        raise bad_request(f"tool_choice {body.tool_choice!r} already constrains the output; leave out {grammar.param}",
                          grammar.param.split(".")[0])
    grammar = plan.grammar or grammar or plan.call_grammar  # the client's own constraint wins over auto's
    prompt_ids = await ctx.tokenize_chat(body.messages, body.add_generation_prompt, plan.template_tools,
                                         body.chat_template_kwargs)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    # Without max_tokens a chat answer may use the rest of the context, as in vLLM.
    params = build_sampling_params(body, ctx.defaults, max_tokens, None, (body.top_logprobs or 0) if body.logprobs
                                   else None, None, ctx.max_num_seqs, ctx.vocab_size)
    if grammar is not None:
        params.grammar = await compile_grammar(ctx, grammar)
        if ctx.reasoning_parser is not None and not _reasoning_closed_in_prompt(ctx, prompt_ids):
            params.grammar = AfterReasoning(params.grammar, ctx.tokenizer.encode(CLOSE, add_special_tokens=False))
    if plan.parser is not None and plan.parser.keeps_special_tokens:
        params.skip_special_tokens = False  # the format's markers are special tokens
    generation = await submit(ctx, [prompt_ids], params, PARAM_NAMES, "messages", lora)
    response_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        events = _chunks(ctx, generation, response_id, created, len(prompt_ids), include_usage, plan.parser)
        return GenerationStream(generation, events)
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
            choice.stop_reason = delta.stop_reason if delta.stop_reason is not None else choice.stop_reason
    completion_tokens = sum(c.num_tokens for c in choices)
    return JSONResponse({
        "id": response_id, "object": "chat.completion", "created": created, "model": ctx.model_name,
        "choices": [{"index": i, **_answer(ctx.reasoning_parser, plan.parser, c.text, c.finish_reason),
                     "logprobs": _logprobs(ctx, c.logprobs) if body.logprobs else None, "stop_reason": c.stop_reason}
                    for i, c in enumerate(choices)],
        "usage": usage(len(prompt_ids), completion_tokens),
    })


def _reasoning_closed_in_prompt(ctx: ServerContext, prompt_ids: list[int]) -> bool:
    """Templates that turn thinking off end the prompt with an empty <think></think>: no reasoning follows."""
    return CLOSE in ctx.tokenizer.decode(prompt_ids[-8:], skip_special_tokens=False)


def _answer(reasoning_parser: ReasoningParser | None, parser: ToolParser | None, text: str,
            finish_reason: str | None) -> dict:
    """The message and finish reason of one choice: reasoning split off, tool calls read out of its text."""
    message: dict = {"role": "assistant"}
    if reasoning_parser is not None:
        message["reasoning_content"], text = reasoning_parser.split(text)
    content, calls = parser.extract(text) if parser is not None else (text, [])
    if not calls:
        return {"message": {**message, "content": text}, "finish_reason": finish_reason}
    return {"message": {**message, "content": content, "tool_calls": [c.as_dict() for c in calls]},
            "finish_reason": "tool_calls" if finish_reason == "stop" else finish_reason}


async def _chunks(ctx: ServerContext, generation: Generation, response_id: str, created: int,
                  num_prompt_tokens: int, include_usage: bool, parser: ToolParser | None) -> AsyncIterator[dict]:
    want_logprobs = generation.params.logprobs is not None
    streams = [ChoiceDeltas(ctx.reasoning_parser, parser) for _ in range(generation.params.n)]

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
        for delta in output.deltas:
            completion_tokens += len(delta.token_ids)
            stream = streams[delta.index]
            finish_reason = delta.finish_reason
            pieces = stream.push(delta.text)
            if finish_reason is not None:
                pieces += stream.finish()
                if stream.has_calls and finish_reason == "stop":
                    finish_reason = "tool_calls"
            if not pieces and finish_reason is None and not want_logprobs:
                continue  # bytes of a character still incomplete, or text held back (stop string, tool call)
            pieces = pieces or [{}]
            for j, piece in enumerate(pieces):
                last = j == len(pieces) - 1
                yield chunk([{"index": delta.index, "delta": piece,
                              "logprobs": _logprobs(ctx, shown_logprobs(delta, generation.params,
                                                                        ctx.tokenizer.eos_token_ids))
                              if want_logprobs and j == 0 else None,
                              "finish_reason": finish_reason if last else None,
                              "stop_reason": delta.stop_reason if last else None}])
    if include_usage:
        yield {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": ctx.model_name,
               "choices": [], "usage": usage(num_prompt_tokens, completion_tokens)}


def _logprobs(ctx: ServerContext, entries: list[TokenLogprobs]) -> dict:
    return chat_logprobs(ctx.token_bytes, entries)
