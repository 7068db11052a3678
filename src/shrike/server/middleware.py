"""ASGI guards that run before any endpoint: API-key check, request-body limits, closing after a refusal."""
from __future__ import annotations

import asyncio
import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shrike.server.connection import DEFAULT_BODY_TIMEOUT_SECONDS
from shrike.server.errors import APIError

MAX_BODY_BYTES = 8 << 20  # a full 128k-token prompt as JSON token ids is about 1 MiB


# What stays reachable without the API key (as in vLLM): probes, monitoring and API documentation,
# none of which reaches the model or its tokenizer. Everything else, unknown paths included, needs the key,
# so a route added later is guarded unless it is listed here on purpose.
OPEN_PATHS = frozenset({"/", "/health", "/metrics", "/version", "/openapi.json", "/docs", "/redoc"})
# The chat page's own files (it asks for the key itself) and the /docs and /redoc pages' scripts and styles:
# loading them must not need one.
OPEN_PREFIXES = ("/web/", "/static-offline-docs/")


class APIKeyMiddleware:
    """`Authorization: Bearer KEY` on every path but OPEN_PATHS and OPEN_PREFIXES."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if scope["type"] == "http" and path not in OPEN_PATHS and not path.startswith(OPEN_PREFIXES):
            given = dict(scope["headers"]).get(b"authorization", b"")
            # Constant time: how much of a guess matched must not show in the response time.
            if not hmac.compare_digest(given, self.expected):
                error = APIError("missing or wrong API key: send `Authorization: Bearer <key>`", 401,
                                 code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class UnreadBodyClosesConnection:
    """A response that starts before the request's body was read in full closes the connection.

    That is every refusal made before the body matters (401, 404, 413, 408, 503 while draining): the
    rest of the body is never read, as a reverse proxy would do, so an unauthenticated client cannot
    make the server take in hundreds of megabytes.
    """

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        body_pending = headers.get(b"content-length", b"0") not in (b"", b"0") or b"transfer-encoding" in headers

        async def receive_watched() -> Message:
            nonlocal body_pending
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_pending = False
            return message

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start" and body_pending:
                message = {**message, "headers": [*[(k, v) for k, v in message.get("headers", [])
                                                    if k.lower() != b"connection"], (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive_watched, send_closing)


class RequestBodyMiddleware:
    """Reads the body up front: over MAX_BODY_BYTES is 413, JSON that is not UTF-8 is a clear 400, a body whose
    next piece takes longer than body_timeout seconds to come is 408.

    The endpoint then receives the body in one piece and, after it, the client's disconnect.
    """

    def __init__(self, app: ASGIApp, body_timeout: float = DEFAULT_BODY_TIMEOUT_SECONDS):
        self.app = app
        self.body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            await _too_large(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), self.body_timeout)
            except asyncio.TimeoutError:
                await APIError(f"the request body stopped arriving (nothing for {self.body_timeout:g} s)", 408,
                               code="request_timeout", headers={"Connection": "close"}).response()(scope, receive,
                                                                                                  send)
                return
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                await _too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as e:
            await APIError(f"the request body is not valid UTF-8 (byte {e.start}); JSON bodies must be UTF-8",
                           400).response()(scope, receive, send)
            return

        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _too_large(scope: Scope, receive: Receive, send: Send) -> None:
    error = APIError(f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB", 413, code="request_too_large",
                     headers={"Connection": "close"})
    await error.response()(scope, receive, send)
