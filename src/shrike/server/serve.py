"""`shrike serve`: load the model, listen, serve until SIGTERM or SIGINT, exit 0."""
from __future__ import annotations

import argparse
import logging
import signal
import socket
import threading

import uvicorn

from shrike import __version__, kernels
from shrike.default_model import DEFAULT_GGUF_FILE
from shrike.engine.async_engine import AsyncEngine
from shrike.engine.config import engine_config_from_args
from shrike.engine.llm_engine import LLMEngine
from shrike.errors import ConfigError
from shrike.sampling.grammar import GrammarCompiler
from shrike.sampling.grammar_backends import new_grammar_compiler
from shrike.server.app import build_app
from shrike.server.connection import ConnectionLimits, guarded_protocol
from shrike.server.context import ServerContext
from shrike.server.metrics import ServerMetrics
from shrike.server.reasoning import ReasoningParser
from shrike.server.sampling import SamplingDefaults
from shrike.server.shutdown import DrainingServer

logger = logging.getLogger("shrike.server")

# Once draining is over: how long uvicorn waits for connections to close before cancelling them.
CONNECTION_CLOSE_SECONDS = 2
# How long an idle keep-alive connection stays open. Longer than the 5 s after which httpx (so the openai
# client) drops idle connections itself: with equal timeouts a client can send its next request on a
# connection in the very moment the server closes it, and that request fails with a read error.
KEEP_ALIVE_SECONDS = 15


def serve_main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # uvicorn's own start-up chatter would bury the one line that matters; its warnings still show.
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    tool_parser_class = _tool_parser_class(args)
    listener = listen(args.host, args.port)
    ctx, engine = build_server_context(args, tool_parser_class)
    async_engine = ctx.async_engine
    host, port = listener.getsockname()[:2]
    limits = ConnectionLimits(args.header_timeout, args.body_timeout, args.max_header_bytes, args.max_headers)
    web_ui = args.web_ui and engine.pooler is None  # an embedding model has nothing to chat with
    app = build_app(ctx, log_stats=not args.disable_log_stats,
                    startup_message=_startup_line(ctx, engine, host, port, args.generation_config, web_ui),
                    web_ui=web_ui, body_timeout=limits.body_timeout)
    server = DrainingServer(uvicorn.Config(app, log_config=None, timeout_graceful_shutdown=CONNECTION_CLOSE_SECONDS,
                                           timeout_keep_alive=KEEP_ALIVE_SECONDS, http=guarded_protocol(limits)),
                            ctx.drain, args.shutdown_timeout, async_engine.stop)
    # uvicorn re-raises the signal it stopped for once it has put back the previous handlers;
    # a requested stop is a success, so those handlers let it pass and we exit 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: None)
    server.run(sockets=[listener])
    logger.info("stopped")
    return 0


def build_server_context(args: argparse.Namespace, tool_parser_class: type | None = None
                         ) -> tuple[ServerContext, LLMEngine]:
    """Load the model and everything the endpoints need (the engine loop starts with the app)."""
    tool_parser_class = tool_parser_class or _tool_parser_class(args)
    engine = LLMEngine(engine_config_from_args(args))
    defaults = SamplingDefaults.for_model(engine.model_dir, args.generation_config)
    names = args.served_model_name or [args.model or DEFAULT_GGUF_FILE.split(".")[0]]
    metrics = ServerMetrics(names[0], lambda: async_engine.load)
    async_engine = AsyncEngine(engine, args.max_queue_len, metrics)
    ctx = ServerContext(async_engine=async_engine, tokenizer=engine.tokenizer, served_model_names=names,
                        model_root=str(args.model or engine.model_dir), max_model_len=engine.max_model_len,
                        vocab_size=engine.model_config.vocab_size, max_num_seqs=args.max_num_seqs,
                        defaults=defaults, metrics=metrics, api_key=args.api_key,
                        grammar_compiler=_grammar_compiler(args.structured_outputs_backend, engine),
                        tool_parser_class=tool_parser_class, enable_auto_tool_choice=args.enable_auto_tool_choice,
                        reasoning_parser=ReasoningParser(args.reasoning_parser) if args.reasoning_parser else None)
    return ctx, engine


def _tool_parser_class(args: argparse.Namespace) -> type | None:
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise ConfigError("--enable-auto-tool-choice needs --tool-call-parser NAME (hermes, llama3_json, mistral, "
                          "pythonic)")
    if args.tool_call_parser is None:
        return None
    from shrike.server.tools import build_server_registry
    return build_server_registry().tool_parser(args.tool_call_parser).target


def _grammar_compiler(backend: str, engine: LLMEngine) -> GrammarCompiler:
    try:
        compiler = new_grammar_compiler(backend, engine.tokenizer, engine.model_config.vocab_size)
    except ImportError as e:
        raise ConfigError(str(e)) from None
    # The backend's view of the vocabulary takes about a second; build it while the server starts.
    threading.Thread(target=compiler.warm_up, name="shrike-grammar-warm-up", daemon=True).start()
    return compiler


def listen(host: str, port: int) -> socket.socket:
    """Bind before the (slow) model load, so a taken port fails at once."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        listener = socket.socket(family, kind, proto)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}; choose another --host or --port") \
            from None
    listener.set_inheritable(True)
    return listener


def _footprint_text(engine: LLMEngine) -> str:
    """' (parameters A B active of T B; a decoded token reads ...)', or nothing when the checkpoint cannot tell."""
    return f" ({engine.footprint.describe()})" if engine.footprint else ""


def _startup_line(ctx: ServerContext, engine: LLMEngine, host: str, port: int, generation_config: str,
                  web_ui: bool) -> str:
    plan = engine.kv_plan
    shown_host = f"[{host}]" if ":" in host else host
    return (f"Shrike {__version__} serving {ctx.model_name!r} at http://{shown_host}:{port}/v1 - "
            f"weights {engine.weights_source}{_footprint_text(engine)}, dtype {str(engine.dtype).removeprefix('torch.')}, "
            f"kernels {kernels.active_isa()}, max-model-len {engine.max_model_len}, "
            f"KV cache {str(engine.kv_dtype).removeprefix('torch.')} {plan.bytes_per_token} bytes/token, "
            f"{plan.capacity_tokens} tokens in {plan.cache_bytes / (1 << 30):.2f} GiB ({plan.reason}; "
            f"{plan.max_concurrent_full_sequences} full-length sequences), "
            f"max-num-seqs {ctx.max_num_seqs}, queue {ctx.async_engine.capacity - ctx.max_num_seqs}, "
            f"API key {'required' if ctx.api_key else 'off'}, chat page {'at /' if web_ui else 'off'}, "
            + (f"embedding model (/v1/embeddings), {engine.embedding_size} dimensions, {engine.pooler.describe()}"
               if engine.pooler is not None else f"sampling defaults ({generation_config}) {ctx.defaults.describe()}"))
