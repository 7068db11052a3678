"""Tool calling: the built-in tool-call parsers (chosen with --tool-call-parser) and their registration.

A plugin adds a format with ``registrar.register_tool_parser(name, MyParser)`` (a ToolParser subclass).
"""
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


def register_tool_parsers(registry) -> None:
    for name, parser in BUILTIN_TOOL_PARSERS.items():
        registry.register_tool_parser(name, parser)


__all__ = ["PartialCall", "ToolCall", "ToolParser", "register_tool_parsers", "BUILTIN_TOOL_PARSERS"]
