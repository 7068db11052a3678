"""How a chat request's tools and tool_choice shape its generation and its answer."""
from __future__ import annotations

from dataclasses import dataclass

from shrike.sampling.grammar import GrammarSpec
from shrike.server.context import ServerContext
from shrike.server.errors import bad_request
from shrike.server.protocol import ChatCompletionRequest
from shrike.server.tools.base import ToolParser
from shrike.server.tools.hermes import HermesToolParser
from shrike.server.tools.forced import NamedToolParser, RequiredToolParser, parameters_schema, required_schema


@dataclass
class ToolPlan:
    template_tools: list[dict] | None  # what the chat template is given
    grammar: GrammarSpec | None  # forced calls (required or named)
    parser: ToolParser | None  # reads calls out of the output; None: the output is content
    call_grammar: GrammarSpec | None = None  # auto: free text, each call constrained once it starts


def plan_tools(body: ChatCompletionRequest, ctx: ServerContext) -> ToolPlan:
    tools = body.tools or []
    choice = body.tool_choice
    if not tools:
        if choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools: give the functions to choose from", "tool_choice")
        return ToolPlan(None, None, None)
    _check_tools(tools)
    if choice == "none":
        return ToolPlan(None, None, None)
    if choice in (None, "auto"):
        if not ctx.enable_auto_tool_choice:
            return ToolPlan(tools, None, None)
        # A template that ignores tools gets them in the Hermes format (shrike.template_tools), whatever the parser.
        generic = ctx.tokenizer.tool_support(tools).needs_generic_prompt
        parser = HermesToolParser() if generic else ctx.tool_parser()
        return ToolPlan(tools, None, parser, parser.call_grammar(tools))
    if choice == "required":
        spec = GrammarSpec("json_schema", required_schema(tools, body.parallel_tool_calls), "tools")
        return ToolPlan(tools, spec, RequiredToolParser())
    name = _named(choice)
    tool = next((t for t in tools if t["function"]["name"] == name), None)
    if tool is None:
        raise bad_request(f"tool_choice names {name!r}, which is not among the tools "
                          f"({', '.join(t['function']['name'] for t in tools)})", "tool_choice")
    return ToolPlan(tools, GrammarSpec("json_schema", parameters_schema(tool), "tools"), NamedToolParser(name))


def _named(choice) -> str:
    function = choice.get("function") if isinstance(choice, dict) else None
    if choice.get("type") != "function" or not isinstance(function, dict) or not isinstance(
            function.get("name"), str):
        raise bad_request('tool_choice must be "none", "auto", "required" or {"type": "function", '
                          '"function": {"name": ...}}', "tool_choice")
    return function["name"]


def _check_tools(tools: list[dict]) -> None:
    for i, tool in enumerate(tools):
        function = tool.get("function")
        if tool.get("type") != "function" or not isinstance(function, dict) or not isinstance(
                function.get("name"), str) or not function["name"]:
            raise bad_request(f'tools.{i}: expected {{"type": "function", "function": {{"name": ..., '
                              '"parameters": {...}}}', "tools")
        if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
            raise bad_request(f"tools.{i}.function.parameters must be a JSON schema object", "tools")
