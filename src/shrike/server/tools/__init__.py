"""Tool calling: the built-in tool-call parsers (chosen with --tool-call-parser) and their registration.

A plugin adds a format with ``registrar.register_tool_parser(name, MyParser)`` (a ToolParser subclass).
The built-in ones join the registry here, in the server, so that loading a model never imports them.
"""
import os
from collections.abc import Mapping

from shrike.plugins import build_registry
from shrike.registry import Registry
from shrike.server.tools.base import PartialCall, ToolCall, ToolParser
from shrike.server.tools.hermes import HermesToolParser
from shrike.server.tools.llama3_json import Llama3JsonToolParser
from shrike.server.tools.mistral import MistralToolParser
from shrike.server.tools.pythonic import PythonicToolParser

BUILTIN_TOOL_PARSERS = {
    "hermes": HermesToolParser,  # also the Qwen2.5 / Qwen3 chat templates
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "pythonic": PythonicToolParser,
}


def register_tool_parsers(registry: Registry) -> None:
    for name, parser in BUILTIN_TOOL_PARSERS.items():
        registry.register_tool_parser(name, parser)


def build_server_registry(environ: Mapping[str, str] = os.environ) -> Registry:
    """build_registry()'s built-ins and plugins, and the built-in tool-call parsers."""
    registry = build_registry(environ)
    register_tool_parsers(registry)
    return registry


__all__ = ["PartialCall", "ToolCall", "ToolParser", "build_server_registry", "register_tool_parsers",
           "BUILTIN_TOOL_PARSERS"]
