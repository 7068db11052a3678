"""POST /v1/completions."""
from __future__ import annotations

import codecs
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi.responses import JSONResponse
from starlette.requests import Request
from starlette.responses import Response

from shrike.engine.async_engine import Generation
from shrike.engine.llm_engine import CompletionDelta, RequestOutput
from shrike.sampling.sampler import TokenLogprobs
from shrike.server.context import ServerContext
from shrike.server.errors import bad_request
from shrike.server.generation import (ChoiceText, GenerationStream, clamp_logprob, outputs_until_disconnect,
                                      submit, usage)
from shrike.server.logprobs import shown_logprobs
from shrike.server.protocol import CompletionRequest
from shrike.server.sampling import build_sampling_params
from shrike.server.structured import compile_grammar, requested_grammar

PARAM_NAMES = set(CompletionRequest.model_fields)
# OpenAI's default for the legacy completions endpoint.
DEFAULT_MAX_TOKENS = 16


@dataclass
class _Prompt:
    text: str  # what echo repeats
    ids: list[int]


async def _prompts(ctx: ServerContext, prompt: str | list[str] | list[int] | list[list[int]]) -> list[_Prompt]:
    if isinstance(prompt, str):
        return [_Prompt(prompt, await ctx.tokenize(prompt, True, "prompt"))]
    if not prompt:
        raise bad_request("prompt must not be an empty list", "prompt")
    if all(isinstance(p, int) for p in prompt):
        prompt = [prompt]
    prompts = []
    for item in prompt:
        if isinstance(item, str):
            prompts.append(_Prompt(item, await ctx.tokenize(item, True, "prompt")))
        else:
            # Before decoding it for echo: a megabyte of ids would otherwise hold up the event loop first.
            ctx.check_prompt_length(len(item), "prompt")
            ctx.check_token_ids(item, "prompt")
            prompts.append(_Prompt(ctx.tokenizer.decode(item, skip_special_tokens=False), list(item)))
    return prompts


def _reject_unsupported(body: CompletionRequest) -> None:
    if body.suffix:
        raise bad_request("suffix is not supported: this server has no fill-in-the-middle mode; leave it out",
                          "suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise bad_request(f"best_of is not supported (it may only equal n, {body.n}); leave it out", "best_of")


async def create_completion(body: CompletionRequest, request: Request, ctx: ServerContext) -> Response:
    lora = ctx.check_model(body.model)
    _reject_unsupported(body)
    prompts = await _prompts(ctx, body.prompt)
    # echo with max_tokens 0 scores the prompt: one token is computed (the prompt's logprobs come with it) and dropped.
    scoring = body.max_tokens == 0
    if scoring and not body.echo:
        raise bad_request("max_tokens 0 generates nothing; set echo to true to get the prompt's logprobs, "
                          "or ask for at least 1 token", "max_tokens")
    params = build_sampling_params(body, ctx.defaults, 1 if scoring else body.max_tokens, DEFAULT_MAX_TOKENS,
                                   body.logprobs, body.logprobs if body.echo else None, ctx.max_num_seqs,
                                   ctx.vocab_size)
    grammar = requested_grammar(body)
    if grammar is not None:
        params.grammar = await compile_grammar(ctx, grammar)
    generation = await submit(ctx, [p.ids for p in prompts], params, PARAM_NAMES, "prompt", lora)
    response_id = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    num_prompt_tokens = sum(len(p.ids) for p in prompts)
    view = _ChoiceView(ctx, generation, prompts, body.echo, scoring)
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        events = _chunks(ctx, generation, view, response_id, created, num_prompt_tokens, include_usage)
        return GenerationStream(generation, events)
    outputs = await outputs_until_disconnect(generation, request)
    if outputs is None:
        return Response(status_code=499)  # nobody is listening; the status only reaches the access log
    choices = [ChoiceText() for _ in range(generation.num_sequences)]
    logprobs = [_LogprobsBuilder(ctx) for _ in choices]
    for output in outputs:
        for index, delta, prefix_text, prefix_logprobs in view.deltas(output):
            choice = choices[index]
            choice.text += prefix_text + delta.text
            choice.num_tokens += len(delta.token_ids)
            logprobs[index].extend(prefix_logprobs)
            logprobs[index].add_generated(shown_logprobs(delta, params, ctx.tokenizer.eos_token_ids))
            choice.finish_reason = delta.finish_reason or choice.finish_reason
            choice.stop_reason = delta.stop_reason if delta.stop_reason is not None else choice.stop_reason
    return JSONResponse({
        "id": response_id, "object": "text_completion", "created": created, "model": ctx.model_name,
        "choices": [{"index": i, "text": c.text,
                     "logprobs": logprobs[i].result() if body.logprobs is not None else None,
                     "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
                    for i, c in enumerate(choices)],
        "usage": usage(num_prompt_tokens, sum(c.num_tokens for c in choices)),
    })


async def _chunks(ctx: ServerContext, generation: Generation, view: "_ChoiceView", response_id: str, created: int,
                  num_prompt_tokens: int, include_usage: bool) -> AsyncIterator[dict]:
    want_logprobs = generation.params.logprobs is not None
    logprobs = [_LogprobsBuilder(ctx) for _ in range(generation.num_sequences)]
    completion_tokens = 0
    async for output in generation:
        choices = []
        for index, delta, prefix_text, prefix_logprobs in view.deltas(output):
            completion_tokens += len(delta.token_ids)
            text = prefix_text + delta.text
            if not text and delta.finish_reason is None and not want_logprobs:
                continue  # bytes of a character still incomplete, or text held back as a possible stop string
            choice_logprobs = None
            if want_logprobs:
                builder = logprobs[index]
                builder.start_chunk()
                builder.extend(prefix_logprobs)
                builder.add_generated(shown_logprobs(delta, generation.params, ctx.tokenizer.eos_token_ids))
                choice_logprobs = builder.result()
            choices.append({"index": index, "text": text, "logprobs": choice_logprobs,
                            "finish_reason": delta.finish_reason, "stop_reason": delta.stop_reason})
        if choices:
            event = {"id": response_id, "object": "text_completion", "created": created, "model": ctx.model_name,
                     "choices": choices}
            if include_usage:
                event["usage"] = None
            yield event
    if include_usage:
        yield {"id": response_id, "object": "text_completion", "created": created, "model": ctx.model_name,
               "choices": [], "usage": usage(num_prompt_tokens, completion_tokens)}


class _ChoiceView:
    """Numbers choices across prompts (prompt i, sample j -> i * n + j) and puts the echoed prompt first."""

    def __init__(self, ctx: ServerContext, generation: Generation, prompts: list[_Prompt], echo: bool,
                 scoring: bool):
        self.ctx, self.generation, self.prompts, self.echo, self.scoring = ctx, generation, prompts, echo, scoring
        self.echoed: set[int] = set()
        self.prompt_logprobs: dict[str, list[TokenLogprobs | None]] = {}

    def deltas(self, output: RequestOutput):
        """-> (choice index, delta, echoed prompt text, echoed prompt (token id, logprobs) pairs)."""
        prompt_index = self.generation.prompt_index(output.request_id)
        prompt = self.prompts[prompt_index]
        if output.prompt_logprobs is not None:
            self.prompt_logprobs[output.request_id] = output.prompt_logprobs
        for delta in output.deltas:
            if self.scoring:  # the one token computed for the prompt's logprobs is not part of the answer
                delta = CompletionDelta(delta.index, [], "", [], "length")
            index = prompt_index * self.generation.params.n + delta.index
            if not self.echo or index in self.echoed:
                yield index, delta, "", []
                continue
            self.echoed.add(index)
            entries = self.prompt_logprobs.get(output.request_id) or [None] * len(prompt.ids)
            yield index, delta, prompt.text, list(zip(prompt.ids, entries))


class _LogprobsBuilder:
    """The legacy completions logprobs object: tokens, their logprobs, top alternatives, text offsets."""

    def __init__(self, ctx: ServerContext):
        self.ctx = ctx
        self.offset = 0  # in characters of the choice's text so far
        # A character split over several tokens starts at the first of them; the offset moves once it is whole.
        self.utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self.start_chunk()

    def start_chunk(self) -> None:
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict[str, float] | None] = []
        self.text_offset: list[int] = []

    def extend(self, pairs: list[tuple[int, TokenLogprobs | None]]) -> None:
        for token_id, entry in pairs:
            text = self.ctx.token_text(token_id)
            self.tokens.append(text)
            self.text_offset.append(self.offset)
            self.offset += len(self.utf8.decode(self.ctx.token_bytes.of(token_id)))
            if entry is None:  # the first prompt token has nothing before it to be predicted from
                self.token_logprobs.append(None)
                self.top_logprobs.append(None)
                continue
            self.token_logprobs.append(clamp_logprob(entry.logprob))
            # OpenAI always lists the chosen token among the alternatives.
            top = {self.ctx.token_text(t): clamp_logprob(lp) for t, lp in zip(entry.top_ids, entry.top_logprobs)}
            top.setdefault(text, clamp_logprob(entry.logprob))
            self.top_logprobs.append(top)

    def add_generated(self, entries: list[TokenLogprobs]) -> None:
        self.extend([(entry.token_id, entry) for entry in entries])

    def result(self) -> dict:
        return {"tokens": self.tokens, "token_logprobs": self.token_logprobs, "top_logprobs": self.top_logprobs,
                "text_offset": self.text_offset}
