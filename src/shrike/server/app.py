"""The FastAPI application: routes, guards and the engine loop's lifetime."""
from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline

from shrike import __version__
from shrike.server.chat import create_chat_completion
from shrike.server.connection import DEFAULT_BODY_TIMEOUT_SECONDS
from shrike.server.completions import create_completion
from shrike.server.context import ServerContext
from shrike.server.embeddings import install_embeddings
from shrike.server.lora import install_lora, model_cards
from shrike.server.errors import APIError, install_error_handlers
from shrike.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from shrike.server.middleware import APIKeyMiddleware, RequestBodyMiddleware, UnreadBodyClosesConnection
from shrike.server.openapi import install_openapi
from shrike.server.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from shrike.server.responses import install_responses
from shrike.server.shutdown import DrainMiddleware
from shrike.server.tokenizer_info import tokenizer_info
from shrike.server.webui import mount_web_ui

logger = logging.getLogger(__name__)

STATS_LOG_INTERVAL_SECONDS = 10.0


def build_app(ctx: ServerContext, log_stats: bool = True, startup_message: str | None = None,
              web_ui: bool = True, body_timeout: float = DEFAULT_BODY_TIMEOUT_SECONDS) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        ctx.async_engine.start()
        if startup_message:
            logger.info(startup_message)
        stats = asyncio.ensure_future(_log_stats(ctx)) if log_stats else None
        try:
            yield
        finally:
            if stats is not None:
                stats.cancel()
            await ctx.async_engine.stop()
            ctx.metrics.close()

    # /docs and /redoc load Swagger UI and ReDoc from files shipped in fastapi-offline: they work without internet.
    app = FastAPIOffline(title="Shrike", version=__version__, lifespan=lifespan,
                  description="OpenAI-compatible API served by Shrike, a CPU-native LLM engine.")
    install_error_handlers(app)
    install_openapi(app, api_key_required=bool(ctx.api_key), vocab_size=ctx.vocab_size,
                    tokenizer_vocab_size=ctx.tokenizer.vocab_size, max_num_seqs=ctx.max_num_seqs,
                    max_model_len=ctx.max_model_len)
    app.add_middleware(RequestBodyMiddleware, body_timeout=body_timeout)
    if ctx.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=ctx.api_key)
    # While shutting down everything, /health included, is refused before any other work.
    app.add_middleware(DrainMiddleware, state=ctx.drain)
    app.add_middleware(UnreadBodyClosesConnection)

    @app.get("/health")
    async def health() -> Response:
        if not ctx.async_engine.is_running:
            raise APIError("the engine loop is not running", 503, "service_unavailable")
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(ctx.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": model_cards(ctx)}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict:
        ctx.check_model(model_id)
        return next(m for m in (await models())["data"] if m["id"] == model_id)

    install_responses(app, ctx)
    install_embeddings(app, ctx)
    install_lora(app, ctx)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await create_completion(body, request, ctx)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await create_chat_completion(body, request, ctx)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> JSONResponse:
        ctx.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError("give exactly one of prompt and messages", param="prompt")
        if body.messages is not None:
            ids = await ctx.tokenize_chat(body.messages, body.add_generation_prompt, None, body.chat_template_kwargs)
        else:
            ids = await ctx.tokenize(body.prompt, body.add_special_tokens, "prompt")
        return JSONResponse({"count": len(ids), "max_model_len": ctx.max_model_len, "tokens": ids})

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> JSONResponse:
        ctx.check_model(body.model)
        ctx.check_token_ids(body.tokens, "tokens", ctx.tokenizer.vocab_size)
        return JSONResponse({"prompt": await ctx.off_loop(ctx.tokenizer.decode, body.tokens)})

    engine = ctx.async_engine.engine
    info = tokenizer_info(engine.model_dir, ctx.tokenizer, ctx.max_model_len)

    @app.get("/tokenizer_info")
    async def get_tokenizer_info() -> JSONResponse:
        return JSONResponse(info)

    if web_ui:
        mount_web_ui(app)

    return app


async def _log_stats(ctx: ServerContext) -> None:
    """Every 10 s while there is work: throughput, queue and KV-cache use (off with --disable-log-stats)."""
    metrics = ctx.metrics
    last_prompt, last_generated = metrics.prompt_tokens, metrics.generation_tokens
    while True:
        await asyncio.sleep(STATS_LOG_INTERVAL_SECONDS)
        load = ctx.async_engine.load
        prompt, generated = metrics.prompt_tokens - last_prompt, metrics.generation_tokens - last_generated
        last_prompt, last_generated = metrics.prompt_tokens, metrics.generation_tokens
        if prompt or generated or load.running_requests or load.waiting_requests:
            logger.info("prompt throughput %.1f tokens/s, generation throughput %.1f tokens/s, running %d requests, "
                        "waiting %d, KV cache %.1f%% used", prompt / STATS_LOG_INTERVAL_SECONDS,
                        generated / STATS_LOG_INTERVAL_SECONDS, load.running_requests, load.waiting_requests,
                        100 * load.kv_cache_usage)
