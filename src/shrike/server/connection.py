"""Connection hygiene, as a reverse proxy in front of the server would do it.

uvicorn waits for a request's headers forever and takes any number of them: a few sockets
sending one header line a minute (slowloris) hold connections open indefinitely. This HTTP
protocol (uvicorn's httptools one) gives every request's headers a deadline from its first
byte, or from the connection's start, and bounds their count and size; the body's pace is
bounded in RequestBodyMiddleware. Refusals are answered the proxy way, 408 or 431, with the
connection closed.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from http import HTTPStatus

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

DEFAULT_HEADER_TIMEOUT_SECONDS = 10.0  # nginx's client_header_timeout is 60 s; a real client sends its headers at once
DEFAULT_BODY_TIMEOUT_SECONDS = 30.0  # longest silence between two pieces of a request body
DEFAULT_MAX_HEADER_BYTES = 32 << 10  # names and values together, as nginx's large_client_header_buffers 4 x 8k
DEFAULT_MAX_HEADERS = 100  # as Go's net/http, Node's and h2's defaults


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_SECONDS
    body_timeout: float = DEFAULT_BODY_TIMEOUT_SECONDS
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_headers: int = DEFAULT_MAX_HEADERS


class _HeaderLimitExceeded(Exception):
    pass


def guarded_protocol(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with `limits` on each request's headers (pass as uvicorn.Config(http=...))."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._header_deadline: asyncio.TimerHandle | None = None
            self._header_count = self._header_bytes = 0
            self._refusal: tuple[int, str] | None = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._start_header_clock()  # a connection that never sends anything is cut too

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_header_clock()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._header_count = self._header_bytes = 0
            self._start_header_clock()

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_count += 1
            self._header_bytes += len(name) + len(value)
            if self._header_count > limits.max_headers:
                self._refusal = (431, f"more than {limits.max_headers} request headers")
                raise _HeaderLimitExceeded  # stops the parser; uvicorn then calls send_400_response
            if self._header_bytes > limits.max_header_bytes:
                self._refusal = (431, f"request headers larger than {limits.max_header_bytes} bytes")
                raise _HeaderLimitExceeded
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._stop_header_clock()
            super().on_headers_complete()

        def send_400_response(self, msg: str) -> None:
            if self._refusal is None:
                super().send_400_response(msg)
            else:
                self._refuse(*self._refusal)

        def _start_header_clock(self) -> None:
            self._stop_header_clock()
            self._header_deadline = self.loop.call_later(limits.header_timeout, self._headers_too_slow)

        def _stop_header_clock(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _headers_too_slow(self) -> None:
            self._header_deadline = None
            if not self.transport.is_closing():
                self._refuse(408, f"the request headers did not arrive within {limits.header_timeout:g} s")

        def _refuse(self, status: int, message: str) -> None:
            body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                         "code": None}}).encode()
            self.transport.write(b"".join([
                f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n".encode(),
                b"content-type: application/json\r\n", f"content-length: {len(body)}\r\n".encode(),
                b"connection: close\r\n\r\n", body]))
            self.transport.close()

    return GuardedHttpToolsProtocol
