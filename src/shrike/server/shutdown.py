"""Graceful shutdown: on SIGTERM/SIGINT, finish what is in flight, answer new requests 503, then exit.

The listening socket stays open while draining, so a client that arrives late is told why (503 with
`Retry-After`, and /health turns 503 so a load balancer stops routing here) instead of meeting a
refused connection. Once nothing is in flight, uvicorn's own shutdown closes the listener. When the
drain timeout passes first, the engine is stopped, so every request still in flight ends with a
clear error (503 `shutting_down`, or an error event and [DONE] on a stream) rather than a cut
connection. A second signal skips the wait.
"""
from __future__ import annotations

import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from shrike.server.errors import RETRY_AFTER_SECONDS, APIError

logger = logging.getLogger("shrike.server")


@dataclass
class DrainState:
    """Shared by the middleware (which counts requests) and the server (which decides when to stop)."""

    draining: bool = False
    in_flight: int = 0  # HTTP requests whose response has not been completely sent


class DrainMiddleware:
    """Counts requests in flight; while draining, refuses new ones but /metrics with 503 and closes their connection."""

    def __init__(self, app: ASGIApp, state: DrainState):
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.state.draining and scope["path"] != "/metrics":  # monitoring watches the drain too
            error = APIError("the server is shutting down and takes no new requests; retry on another instance or "
                             "after it restarts", 503, "service_unavailable", code="shutting_down",
                             headers={"Retry-After": str(RETRY_AFTER_SECONDS), "Connection": "close"})
            await error.response()(scope, receive, send)
            return
        self.state.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.in_flight -= 1


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: DrainState, drain_timeout: float,
                 stop_engine: Callable[[], Awaitable[None]]):
        super().__init__(config)
        self.state = state
        self.drain_timeout = drain_timeout
        self.drain_deadline = float("inf")
        self.stop_engine = stop_engine

    def handle_exit(self, sig: int, frame) -> None:
        if self.state.draining:
            logger.info("received %s again: stopping now", signal.Signals(sig).name)
            super().handle_exit(sig, frame)
            return
        logger.info("received %s: draining %d request(s) in flight for up to %g s; new requests get 503",
                    signal.Signals(sig).name, self.state.in_flight, self.drain_timeout)
        self.state.draining = True
        self.drain_deadline = time.monotonic() + self.drain_timeout

    async def on_tick(self, counter: int) -> bool:
        # Runs every 0.1 s on the event loop.
        if self.state.draining and not self.should_exit:
            if self.state.in_flight == 0:
                self.should_exit = True
            elif time.monotonic() >= self.drain_deadline:
                logger.warning("drain timeout: ending %d request(s) still in flight with an error",
                               self.state.in_flight)
                await self.stop_engine()
                self.should_exit = True
        return await super().on_tick(counter)
