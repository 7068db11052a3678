"""POST /v1/embeddings, in OpenAI's shape: one vector per input, as floats or as base64 float32 bytes.

Served when the model runs as an embedding model (--runner pooling); on a generation server the route
answers a 400 that says how to start one (and stays out of the OpenAPI document, as it does nothing there).
"""
from __future__ import annotations

import base64
from typing import Literal

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field

from shrike.engine.pooling import PoolingParams
from shrike.server.context import ServerContext
from shrike.server.errors import bad_request
from shrike.server.generation import outputs_until_disconnect, submit
from shrike.server.protocol import Prompt, _Request


class EmbeddingRequest(_Request):
    model: str | None = None
    input: Prompt
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    # vLLM's: keep only each input's last k tokens (-1: the last --max-model-len), so a long text still embeds
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)


PARAM_NAMES = set(EmbeddingRequest.model_fields)


def install_embeddings(app: FastAPI, ctx: ServerContext) -> None:
    pooling = ctx.async_engine.engine.pooler is not None

    @app.post("/v1/embeddings", include_in_schema=pooling)
    async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
        return await create_embeddings(body, request, ctx)


async def _inputs(ctx: ServerContext, value: str | list[str] | list[int] | list[list[int]]) -> list[list[int]]:
    if isinstance(value, str):
        value = [value]
    if not value:
        raise bad_request("input must not be an empty list", "input")
    if all(isinstance(t, int) for t in value):
        value = [value]
    prompts = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            if not item:
                raise bad_request(f"input[{i}] is an empty string; every input needs at least one token", "input")
            prompts.append(await ctx.tokenize(item, True, "input"))
        else:
            if not item:
                raise bad_request(f"input[{i}] is an empty list of token ids", "input")
            ctx.check_token_ids(item, "input")
            prompts.append(list(item))
    return prompts


async def create_embeddings(body: EmbeddingRequest, request: Request, ctx: ServerContext) -> Response:
    lora = ctx.check_model(body.model)
    if ctx.async_engine.engine.pooler is None:
        raise bad_request("this server runs its model for generation; to serve /v1/embeddings start it as an "
                          "embedding model: shrike serve MODEL --runner pooling", "model")
    prompts = await _inputs(ctx, body.input)
    keep = body.truncate_prompt_tokens
    if keep is not None:
        if keep == 0:
            raise bad_request("truncate_prompt_tokens must be -1 (the maximum context length) or at least 1",
                              "truncate_prompt_tokens")
        keep = ctx.max_model_len if keep == -1 else keep
        prompts = [p[-keep:] for p in prompts]
    generation = await submit(ctx, prompts, PoolingParams(dimensions=body.dimensions), PARAM_NAMES, "input", lora)
    outputs = await outputs_until_disconnect(generation, request)
    if outputs is None:
        return Response(status_code=499)  # nobody is listening; the status only reaches the access log
    vectors = {o.request_id: o.embedding for o in outputs if o.embedding is not None}
    data = []
    for index, request_id in enumerate(generation.request_ids):
        vector = vectors[request_id]
        if body.encoding_format == "base64":  # little-endian float32, as OpenAI sends and its client decodes
            vector = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": vector})
    num_tokens = sum(len(p) for p in prompts)
    return JSONResponse({"object": "list", "data": data, "model": body.model or ctx.model_name,
                         "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}})
