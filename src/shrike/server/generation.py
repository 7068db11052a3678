"""Running a request on the engine loop from an endpoint: admission, reading outputs, client disconnects."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from shrike.engine.async_engine import Generation
from shrike.engine.llm_engine import RequestOutput
from shrike.engine.lora import LoRARequest
from shrike.sampling.params import SamplingParams
from shrike.sampling.sampler import TokenLogprobs
from shrike.server.context import ServerContext
from shrike.server.errors import APIError, from_engine_error

# Logprobs of tokens the model all but excludes can be -inf, which JSON cannot carry.
MIN_LOGPROB = -9999.0


async def submit(ctx: ServerContext, prompts: list[list[int]], params: SamplingParams,
                 param_names: set[str], prompt_param: str, lora: LoRARequest | None = None) -> Generation:
    try:
        return await ctx.async_engine.submit(prompts, params, lora)
    except Exception as e:  # noqa: BLE001 - from_engine_error re-raises what is not the client's doing
        raise from_engine_error(e, param_names, prompt_param) from None


async def outputs_until_disconnect(generation: Generation, request: Request) -> list[RequestOutput] | None:
    """All outputs of a non-streamed request, or None if its client went away first (the request is aborted)."""
    async def read_all() -> list[RequestOutput]:
        return [output async for output in generation]

    reading = asyncio.ensure_future(read_all())
    watching = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({reading, watching}, return_when=asyncio.FIRST_COMPLETED)
        if reading.done():
            try:
                return reading.result()
            except Exception as e:  # noqa: BLE001
                raise from_engine_error(e) from None
        return None
    finally:
        reading.cancel()
        watching.cancel()
        generation.close()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def stream_events(generation: Generation, events: AsyncIterator[dict]) -> AsyncIterator[str]:
    """Server-sent events: each dict as a `data:` line, an error as one last event, then [DONE]."""
    try:
        async for event in events:
            yield sse(event)
    except Exception as e:  # noqa: BLE001 - the status line is long gone; the error goes in the stream
        try:
            error = from_engine_error(e)
        except Exception:  # noqa: BLE001
            error = APIError(f"internal error ({type(e).__name__})", 500, "server_error")
        yield sse(error.body())
    finally:
        generation.close()
    yield "data: [DONE]\n\n"


class GenerationStream(StreamingResponse):
    """Server-sent events of a generation, which is closed (aborted if unfinished) however the response ends.

    The event generator closes it in its `finally`, but only once it has started, and a background
    task does not run when the response is cancelled: a response cancelled or failing before its
    first event (a client gone that early) would otherwise strand the admission.
    """

    def __init__(self, generation: Generation, events: AsyncIterator[dict]):
        super().__init__(stream_events(generation, events), media_type="text/event-stream")
        self.generation = generation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.generation.close()


def sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, allow_nan=False)}\n\n"


def clamp_logprob(value: float) -> float:
    return max(value, MIN_LOGPROB)


@dataclass
class ChoiceText:
    """One choice accumulated from its deltas (non-streamed responses)."""

    text: str = ""
    num_tokens: int = 0
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # vLLM's: the stop string or stop token id that ended it


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
