"""The ingress deployment: the HTTP face of the cluster behind Ray Serve's proxy.

It reads each request, hashes its prompt prefix for the router, forwards it to an engine replica
and relays the response. It answers /health (from Serve's view of the replicas) and /metrics
(every replica's, labelled by replica) itself. A replica that dies fails only the requests it was
computing: a clean 503 before the response started, an SSE error event after; a request that
had not reached it yet is sent to another replica.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from pydantic import ValidationError
from ray import serve
from ray.exceptions import RayActorError, RayTaskError, TaskCancelledError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from starlette.types import Receive, Scope, Send

from shrike.server.errors import RETRY_AFTER_SECONDS, APIError, validation_error
from shrike.server.middleware import APIKeyMiddleware, RequestBodyMiddleware
from shrike.server.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from shrike.server.ray.metrics_merge import merge_expositions
from shrike.server.ray.prefix import prefix_hashes
from shrike.server.ray.replica import ACCEPTED, REPLICA_HEADER
from shrike.server.ray.routing_state import live_replicas, render_decisions

logger = logging.getLogger("shrike.server.ray")

# How long a request may wait for a replica to take it (e.g. while every replica restarts).
ROUTING_TIMEOUT_SECONDS = 30.0
METRICS_TIMEOUT_SECONDS = 5.0
STATUS_CACHE_SECONDS = 1.0
# What a replica would validate a body against, checked here when every replica is full.
REQUEST_MODELS = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest,
                  "/tokenize": TokenizeRequest, "/detokenize": DetokenizeRequest}


def _replica_lost(error: Exception) -> APIError:
    return APIError(f"the replica computing this request stopped ({type(error).__name__}); retry it, "
                    "the other replicas are serving", 503, "service_unavailable", code="replica_lost",
                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


class IngressApp:
    """A plain ASGI app: forwarding needs no routing table, and endpoints live in the replicas."""

    def __init__(self, engine, app_name: str, engine_deployment: str):
        self.engine = engine.options(stream=True)
        self.app_name = app_name
        self.engine_deployment = engine_deployment
        self._status: tuple[float, dict] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        route = (scope["method"], scope["path"])
        try:
            if route == ("GET", "/health"):
                await self._health(send)
            elif route == ("GET", "/metrics"):
                await self._metrics(send)
            else:
                await self._forward(scope, receive, send)
        except APIError as error:  # raised before anything was sent
            await error.response()(scope, receive, send)
        except Exception as error:  # noqa: BLE001 - likewise; _relay handles what fails after the start
            logger.exception("unexpected error serving %s %s", *route)
            await APIError(f"internal error ({type(error).__name__}); the cluster is still serving", 500,
                           "server_error").response()(scope, receive, send)

    # Forwarding ----------------------------------------------------------------------

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = (await receive()).get("body", b"")  # RequestBodyMiddleware hands it over whole
        request = {"method": scope["method"], "path": scope["path"], "query_string": scope.get("query_string", b""),
                   "headers": [(bytes(k), bytes(v)) for k, v in scope["headers"]], "client": scope.get("client"),
                   "body": body}
        stream = await self._open(request, prefix_hashes(scope["path"], body))
        try:
            await self._relay(stream, send)
        finally:
            stream.cancel()  # no-op once finished; stops the replica's work if our client left

    async def _open(self, request: dict, prefix: tuple[int, ...], replica: str | None = None):
        """A response stream that a live replica has accepted."""
        for attempt in (1, 2):
            try:
                stream = self.engine.remote(request, prefix=prefix, replica=replica)
                first = await asyncio.wait_for(stream.__anext__(), ROUTING_TIMEOUT_SECONDS)
            except asyncio.TimeoutError:
                stream.cancel()
                raise APIError(f"no replica took this request within {ROUTING_TIMEOUT_SECONDS:.0f} s; the cluster "
                               "is starting or every replica is down", 503, "service_unavailable",
                               code="no_replica", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
            except BackPressureError:
                # A malformed request gets its 400 even now: a 503 would have its client retry it in vain.
                raise _malformed(request) or APIError(
                    "the cluster is busy: every replica is full and so is the queue in front of them; retry shortly",
                    503, "service_unavailable", code="queue_full",
                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
            except (RayActorError, DeploymentUnavailableError) as error:
                # It died before it started: nothing of this request was computed for the client.
                logger.warning("a replica was lost before it took a request (%s); %s", type(error).__name__,
                               "retrying on another" if attempt == 1 else "giving up")
                if attempt == 2 or replica is not None:
                    raise _replica_lost(error) from None
                continue
            if first != ACCEPTED:
                raise RuntimeError(f"unexpected first message from a replica: {first!r}")
            return stream
        raise AssertionError("unreachable")

    async def _relay(self, stream, send: Send) -> None:
        started = finished = False
        event_stream = False
        try:
            async for batch in stream:
                for message in batch:
                    if message["type"] == "http.response.start":
                        started = True
                        content_type = dict(message.get("headers", ())).get(b"content-type", b"")
                        event_stream = content_type.startswith(b"text/event-stream")
                    elif message["type"] == "http.response.body" and not message.get("more_body", False):
                        finished = True
                    await send(message)
        except (RayActorError, RayTaskError) as error:
            logger.warning("a replica failed mid-request (%s): %s", type(error).__name__, error)
            lost = _replica_lost(error) if isinstance(error, RayActorError) else APIError(
                f"internal error in a replica ({type(error.cause).__name__}); the cluster is still serving", 500,
                "server_error")
            if not started:
                await send({"type": "http.response.start", "status": lost.status,
                            "headers": [(b"content-type", b"application/json"),
                                        *((k.lower().encode(), v.encode()) for k, v in (lost.headers or {}).items())]})
                await send({"type": "http.response.body", "body": json.dumps(lost.body()).encode()})
                return
            if not finished:
                tail = (f"data: {json.dumps(lost.body())}\n\ndata: [DONE]\n\n".encode() if event_stream else b"")
                await send({"type": "http.response.body", "body": tail, "more_body": False})
            return
        if started and not finished:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    # /health and /metrics ------------------------------------------------------------

    async def _health(self, send: Send) -> None:
        status = await self._deployment_status()
        running = status["replicas"].get("RUNNING", 0)
        # The router hears of a death from the first request that hits it, before Serve's controller.
        routable = live_replicas.get(self.engine_deployment)
        if routable is not None:
            running = min(running, len(routable))
        whole = running == sum(status["replicas"].values()) and status["status"] == "HEALTHY"
        state = "ok" if running and whole else "degraded" if running else "unavailable"
        await _send_json(send, 200 if running else 503, {"status": state, "deployment": status})

    async def _deployment_status(self) -> dict:
        now = time.monotonic()
        if self._status is None or now - self._status[0] > STATUS_CACHE_SECONDS:
            status = await asyncio.to_thread(serve.status)
            deployment = status.applications[self.app_name].deployments[self.engine_deployment]
            self._status = (now, {"status": str(getattr(deployment.status, "value", deployment.status)),
                                  "replicas": {str(getattr(k, "value", k)): v
                                               for k, v in deployment.replica_states.items()},
                                  "message": deployment.message})
        return self._status[1]

    async def _metrics(self, send: Send) -> None:
        scrape = {"method": "GET", "path": "/metrics", "query_string": b"", "headers": [], "body": b""}
        if not live_replicas.get(self.engine_deployment):
            # The handle learns the replica set on its first call.
            await self._collect(await self._open(scrape, ()))
        texts = {}
        # One at a time: calls made while serving one request share its internal request id, and
        # Ray's router cannot tell concurrent ones apart (one of them would never be routed).
        for replica_id in live_replicas.get(self.engine_deployment, []):
            text = await self._scrape(scrape, replica_id)
            if text is not None:
                texts[replica_id] = text
        await _send_text(send, 200, merge_expositions(texts) + render_decisions(),
                         "text/plain; version=0.0.4; charset=utf-8")

    async def _scrape(self, scrape: dict, replica_id: str) -> str | None:
        async def scrape_one() -> str | None:
            answered_by, text = await self._collect(await self._open(scrape, (), replica_id))
            # A FIFO router may hand the slot it found to an older request: keep only a true answer.
            return text if answered_by == replica_id else None

        try:
            return await asyncio.wait_for(scrape_one(), METRICS_TIMEOUT_SECONDS)
        except (APIError, RayActorError, asyncio.TimeoutError) as error:
            logger.warning("no metrics from replica %s (%s: %s)", replica_id, type(error).__name__, error)
            return None

    @staticmethod
    async def _collect(stream) -> tuple[str, str]:
        """(the replica that answered, the response body)."""
        replica, chunks = "", []
        async for batch in stream:
            for message in batch:
                if message["type"] == "http.response.start":
                    replica = dict(message.get("headers", ())).get(REPLICA_HEADER, b"").decode()
                elif message["type"] == "http.response.body":
                    chunks.append(message.get("body", b""))
        return replica, b"".join(chunks).decode()


class _CancelledReceiveIsDisconnect:
    """Ray's proxy cancels a request whose client left by failing the ingress's next receive() with
    TaskCancelledError; to the app below that is the ASGI disconnect it already handles."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def receive_or_disconnect() -> dict:
            try:
                return await receive()
            except TaskCancelledError:
                return {"type": "http.disconnect"}
            except RayTaskError as error:
                if isinstance(error.cause, (TaskCancelledError, asyncio.CancelledError)):
                    return {"type": "http.disconnect"}
                raise

        await self.app(scope, receive_or_disconnect, send)


def _malformed(request: dict) -> APIError | None:
    model = REQUEST_MODELS.get(request["path"]) if request["method"] == "POST" else None
    try:
        if model is not None:
            model.model_validate_json(request["body"])
    except ValidationError as error:
        return validation_error(error.errors(include_url=False))
    return None


async def _send_json(send: Send, status: int, body: dict) -> None:
    await _send_text(send, status, json.dumps(body), "application/json")


async def _send_text(send: Send, status: int, text: str, content_type: str) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode())]})
    await send({"type": "http.response.body", "body": text.encode()})


class ShrikeIngress:
    def __init__(self, engine, engine_deployment: str, api_key: str | None = None):
        # The application's name is the deployer's choice (a Serve config may rename it).
        app_name = serve.get_replica_context().app_name
        self.asgi = RequestBodyMiddleware(IngressApp(engine, app_name, engine_deployment))
        if api_key:
            # The replicas check the key too; checked here first, nothing of a stranger's request is parsed.
            self.asgi = APIKeyMiddleware(self.asgi, api_key)
        self.asgi = _CancelledReceiveIsDisconnect(self.asgi)

    def __serve_build_asgi_app__(self):
        return self.asgi
