"""LoRA adapters on the server: listed by /v1/models (parent: the base model), and, with --allow-runtime-lora,
loaded and unloaded at run time as vLLM does (/v1/load_lora_adapter, /v1/unload_lora_adapter)."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, Response

from shrike.errors import ConfigError
from shrike.server.context import ServerContext
from shrike.server.errors import APIError
from shrike.server.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest


def model_cards(ctx: ServerContext) -> list[dict]:
    """/v1/models: the served names of the base model, then the LoRA adapters, whose parent is the base model."""
    def card(name: str, root: str, parent: str | None) -> dict:
        return {"id": name, "object": "model", "created": ctx.created, "owned_by": "shrike", "root": root,
                "parent": parent, "max_model_len": ctx.max_model_len}

    lora = ctx.async_engine.engine.lora
    adapters = [] if lora is None else list(lora.adapters.items())
    return [card(name, ctx.model_root, None) for name in ctx.served_model_names] + \
        [card(name, str(registered.adapter.path), ctx.model_name) for name, registered in adapters]


def install_lora(app: FastAPI, ctx: ServerContext) -> None:
    engine = ctx.async_engine.engine
    allowed = engine.lora is not None and engine.config.allow_runtime_lora

    def check_allowed() -> None:
        if not allowed:
            raise APIError("loading LoRA adapters at run time is off; start the server with --enable-lora "
                           "--allow-runtime-lora", 404, code="not_found")

    @app.post("/v1/load_lora_adapter", include_in_schema=allowed)
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> Response:
        check_allowed()
        if body.lora_name in ctx.served_model_names:
            raise APIError(f"{body.lora_name!r} is the base model's name; give the adapter another", param="lora_name")
        try:
            await ctx.async_engine.call(lambda e: e.lora.register(body.lora_name, body.lora_path))
        except ConfigError as error:
            raise APIError(str(error), 400, param="lora_path") from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter", include_in_schema=allowed)
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> Response:
        check_allowed()
        try:
            await ctx.async_engine.call(lambda e: e.lora.unregister(body.lora_name))
        except KeyError:
            raise APIError(f"no LoRA adapter named {body.lora_name!r} is loaded; loaded: "
                           f"{', '.join(repr(n) for n in ctx.lora_adapters) or 'none'}", 404, param="lora_name",
                           code="model_not_found") from None
        except ConfigError as error:
            raise APIError(str(error), 400, param="lora_name") from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
