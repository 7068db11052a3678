"""The engine deployment: one Shrike engine and its own FastAPI app per Ray Serve replica.

The ingress forwards each HTTP request whole (method, path, headers, body); the replica runs it
through the same app `shrike serve` runs, so every endpoint, error, limit and the API key behave
exactly as on one machine, and streams the ASGI response messages back.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from ray import serve

from shrike.platform.cpulist import format_cpu_list
from shrike.server.app import build_app
from shrike.server.ray.cores import replica_cores
from shrike.server.serve import build_server_context

logger = logging.getLogger("shrike.server.ray")

REPLICA_HEADER = b"x-shrike-replica"
# Sent before anything else: the request reached a live replica (see ingress.py).
ACCEPTED: list = []
# A cancelled request (its client left) gets this long to wind down through the app before it is cut.
CANCEL_GRACE_SECONDS = 2.0


class ShrikeReplica:
    async def __init__(self, serve_args: dict):
        _log_to_stderr()
        args = argparse.Namespace(**serve_args)
        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id
        cores = replica_cores(context.rank.local_rank, args.cpus_per_replica)
        args.cpu_bind = format_cpu_list(cores)
        args.cpu_threads = min(args.cpu_threads or len(cores), len(cores))
        self.ctx, engine = build_server_context(args)
        self.app = build_app(self.ctx, log_stats=not args.disable_log_stats)
        self.lifespan = _Lifespan(self.app)
        await self.lifespan.startup()
        logger.info("replica %s: %r on cores %s (local rank %d), KV cache %d tokens", self.replica_id,
                    self.ctx.model_name, format_cpu_list(engine.cores), context.rank.local_rank,
                    engine.kv_plan.capacity_tokens)

    async def __call__(self, request: dict, prefix: tuple[int, ...] = (), replica: str | None = None
                       ) -> AsyncIterator[list[dict]]:
        """ASGI messages of the response, batched: whatever is ready is sent together.

        `prefix` and `replica` are read by the router (router.py), not here.
        """
        yield ACCEPTED
        messages: asyncio.Queue = asyncio.Queue()
        disconnected = asyncio.Event()
        body_sent = False

        async def receive() -> dict:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": request["body"], "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (REPLICA_HEADER,
                                                                                 self.replica_id.encode())]}
            messages.put_nowait(message)

        app_call = asyncio.ensure_future(self._run_app(_scope(request), receive, send, messages))
        try:
            while True:
                batch = [await messages.get()]
                while not messages.empty():
                    batch.append(messages.get_nowait())
                done = batch[-1] is None
                batch = [m for m in batch if m is not None]
                if batch:
                    yield batch
                if done:
                    return
        finally:
            if not app_call.done():
                # The ingress cancelled (its client left): tell the app, as a server would.
                disconnected.set()
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(app_call), CANCEL_GRACE_SECONDS)
                app_call.cancel()

    async def _run_app(self, scope: dict, receive, send, messages: asyncio.Queue) -> None:
        try:
            await self.app(scope, receive, send)
        except Exception:  # noqa: BLE001 - the app has already answered 500 and logged it
            pass
        finally:
            messages.put_nowait(None)

    def check_health(self) -> None:
        """Ray restarts a replica whose engine loop has stopped."""
        if not self.ctx.async_engine.is_running:
            raise RuntimeError(f"replica {self.replica_id}: the engine loop is not running")

    async def __del__(self):
        # Ray calls this once in-flight requests have drained (or the drain timed out).
        await self.lifespan.shutdown()


def _log_to_stderr() -> None:
    """Shrike's own lines (start-up, throughput) reach the `shrike serve --ray` terminal through Ray's log
    streaming; Ray leaves non-Ray loggers at WARNING without a handler."""
    shrike_logger = logging.getLogger("shrike")
    if not shrike_logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        shrike_logger.addHandler(handler)
        shrike_logger.setLevel(logging.INFO)
        shrike_logger.propagate = False


def _scope(request: dict) -> dict:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": request["method"], "scheme": "http", "path": request["path"],
            "raw_path": request["path"].encode(), "root_path": "", "query_string": request["query_string"],
            "headers": request["headers"], "client": request.get("client"), "server": None}


class _Lifespan:
    """Drives the app's lifespan (engine loop start and stop) as uvicorn would."""

    def __init__(self, app):
        self.app = app
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.task: asyncio.Future | None = None

    async def startup(self) -> None:
        self.task = asyncio.ensure_future(self.app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                                   self.inbox.get, self.outbox.put))
        await self._step("startup")

    async def shutdown(self) -> None:
        if self.task is not None and not self.task.done():
            await self._step("shutdown")
            await self.task

    async def _step(self, phase: str) -> None:
        await self.inbox.put({"type": f"lifespan.{phase}"})
        reply = await self.outbox.get()
        if reply["type"] != f"lifespan.{phase}.complete":
            raise RuntimeError(f"the app's lifespan {phase} failed: {reply.get('message', reply['type'])}")
