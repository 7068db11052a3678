"""`shrike serve` flags, named as vLLM names them where the meaning is the same: the engine's (shrike.engine.config)
and the server's own."""
from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from shrike.engine.config import add_engine_arguments

API_KEY_ENV = "SHRIKE_API_KEY"
DEFAULT_MAX_QUEUE_LEN = 128
DEFAULT_SHUTDOWN_TIMEOUT = 10.0


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum of {minimum}")
        return value
    return parse


def _port(text: str) -> int:
    value = _int_at_least(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (0..65535)")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a number above 0")
    return value


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    # A mistyped flag deserves one line naming it, not the whole usage block above it.
    parser.error = lambda message: _exit_with_one_line(parser, message)

    add_engine_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=8000, help="TCP port (default: 8000)")
    parser.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                        help="model name(s) clients use in the `model` field; the first one is reported "
                             "(default: the model argument, or the default model's name)")
    parser.add_argument("--max-queue-len", type=_int_at_least(0), default=DEFAULT_MAX_QUEUE_LEN,
                        help="sequences that may wait beyond --max-num-seqs; more get 503 with Retry-After "
                             f"(default: {DEFAULT_MAX_QUEUE_LEN})")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                        help="require `Authorization: Bearer KEY` on every route but /health, /metrics, /version "
                             f"and the API docs (default: ${API_KEY_ENV}, else open)")
    parser.add_argument("--generation-config", default="auto", choices=["auto", "vllm"],
                        help="auto: default sampling settings from the model's generation_config.json; "
                             "vllm: the OpenAI defaults (temperature 1, top_p 1)")
    parser.add_argument("--shutdown-timeout", type=_positive_float, default=DEFAULT_SHUTDOWN_TIMEOUT, metavar="SECONDS",
                        help="after SIGTERM/SIGINT, requests in flight get this long to finish while new ones get "
                             "503; then they end with an error and the server exits 0 "
                             f"(default: {DEFAULT_SHUTDOWN_TIMEOUT:g})")
    parser.add_argument("--structured-outputs-backend", default="llguidance", choices=["llguidance", "xgrammar"],
                        help="grammar engine for response_format, structured_outputs and forced tool calls "
                             "(default: llguidance; xgrammar needs pip install 'shrike[xgrammar]')")
    parser.add_argument("--enable-auto-tool-choice", action="store_true",
                        help="with tool_choice auto, read tool calls out of the model's output (needs "
                             "--tool-call-parser)")
    parser.add_argument("--tool-call-parser", default=None, metavar="NAME",
                        help="the model's tool-call format: hermes (also Qwen2.5/Qwen3), llama3_json, mistral, "
                             "pythonic, or one a plugin registers")
    parser.add_argument("--reasoning-parser", default=None, choices=["deepseek_r1", "qwen3"],
                        help="split <think>...</think> reasoning into reasoning_content (structured outputs "
                             "apply after it)")
    parser.add_argument("--web-ui", action=argparse.BooleanOptionalAction, default=True,
                        help="serve the chat page at / (default: on; --no-web-ui turns it off)")
    parser.add_argument("--disable-log-stats", action="store_true", help="do not log throughput every 10 s")
    _add_connection_arguments(parser)


def _add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    from shrike.server import connection as c  # here: uvicorn is no import of every other command
    group = parser.add_argument_group("connections", "Limits a reverse proxy would set; a request over one is "
                                                     "refused (408, 431) and its connection closed.")
    group.add_argument("--header-timeout", type=_positive_float, default=c.DEFAULT_HEADER_TIMEOUT_SECONDS,
                       metavar="SECONDS", help="time for a request's headers to arrive, from its first byte or the "
                                               f"connection's start (default: {c.DEFAULT_HEADER_TIMEOUT_SECONDS:g})")
    group.add_argument("--body-timeout", type=_positive_float, default=c.DEFAULT_BODY_TIMEOUT_SECONDS,
                       metavar="SECONDS", help="longest wait for the next piece of a request body "
                                               f"(default: {c.DEFAULT_BODY_TIMEOUT_SECONDS:g})")
    group.add_argument("--max-header-bytes", type=_int_at_least(1024), default=c.DEFAULT_MAX_HEADER_BYTES,
                       metavar="BYTES", help="request header names and values together "
                                             f"(default: {c.DEFAULT_MAX_HEADER_BYTES})")
    group.add_argument("--max-headers", type=_int_at_least(1), default=c.DEFAULT_MAX_HEADERS, metavar="N",
                       help=f"request headers (default: {c.DEFAULT_MAX_HEADERS})")


def _exit_with_one_line(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    print(f"{parser.prog}: error: {message}", file=sys.stderr)
    sys.exit(2)
