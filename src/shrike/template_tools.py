"""Tool calling for chat templates that do not render tools, tool calls or tool results.

Many small models' templates (SmolLM2's among them) print only `role` and `content`: the tools of a
request never reach the model, and an assistant turn that only called tools renders as nothing. As
llama.cpp does for such templates, the conversation is rewritten before rendering: the tools go into
the system message with instructions to call them in the Hermes format (`<tool_call>{"name": ...,
"arguments": {...}}</tool_call>`, which the `hermes` parser reads back), earlier calls become that
text in their assistant turn, and results become `<tool_response>` turns.

What a template renders is found out once per template by rendering probe conversations.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

# Names no real conversation contains, to see what of a probe conversation comes out of the template.
_PROBE_TOOL = "shrike_probe_tool_6c1f"
_PROBE_RESULT = "shrike_probe_result_6c1f"

# The Hermes / Qwen2.5 wording, which models fine-tuned for function calling have seen most.
_TOOLS_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""

Render = Callable[[list[dict], "list[dict] | None"], str]


@dataclass(frozen=True)
class TemplateToolSupport:
    renders_tools: bool  # the tools passed to the template appear in the prompt
    renders_tool_calls: bool  # an assistant message's tool_calls appear
    renders_tool_results: bool  # a message of role "tool" appears

    @property
    def needs_generic_prompt(self) -> bool:
        return not self.renders_tools


def probe_template(render: Render, source: str) -> TemplateToolSupport:
    """What a template does with tools; render(messages, tools) -> prompt, raising if the template refuses.

    A template that names tool_calls is taken to render them even if the probe's call does not show (it may
    print only some argument of its own tools).
    """
    user = {"role": "user", "content": "Hi"}
    call = {"id": "call_probe", "type": "function", "function": {"name": _PROBE_TOOL, "arguments": {"x": 1}}}
    tool = {"type": "function", "function": {"name": _PROBE_TOOL, "description": "probe",
                                             "parameters": {"type": "object", "properties": {}}}}
    answer = {"role": "assistant", "content": ""}
    # A template renders a part if the prompt changes with it (it may print only some fields of a call).
    return TemplateToolSupport(
        renders_tools=_differs(render, ([user], [tool]), ([user], None)),
        renders_tool_calls="tool_calls" in source or _differs(render, ([user, {**answer, "tool_calls": [call]}], None),
                                                             ([user, answer], None)),
        renders_tool_results=_shows(render, [user, {**answer, "tool_calls": [call]},
                                             {"role": "tool", "tool_call_id": "call_probe", "content": _PROBE_RESULT}],
                                    _PROBE_RESULT))


def _differs(render: Render, probe: tuple, without: tuple) -> bool:
    try:
        return render(*probe) != render(*without)
    except Exception:  # noqa: BLE001 - a template that refuses the probe does not support what it probes
        return False


def _shows(render: Render, messages: list[dict], needle: str) -> bool:
    try:
        return needle in render(messages, None)
    except Exception:  # noqa: BLE001
        return False


def adapt_conversation(messages: list[dict], tools: list[dict] | None,
                       support: TemplateToolSupport) -> list[dict]:
    """The messages rewritten so that tools, calls and results reach the model through what the template renders."""
    adapted = []
    for message in messages:
        if message.get("tool_calls") and not support.renders_tool_calls:
            calls = "\n".join(hermes_call_text(call) for call in message["tool_calls"])
            message = {key: value for key, value in message.items() if key != "tool_calls"}
            message["content"] = "\n".join(part for part in (message.get("content") or "", calls) if part)
        elif message.get("role") == "tool" and not (support.renders_tool_results and support.renders_tool_calls):
            # The result answers a call written in the Hermes format, so it comes back in that format too.
            message = {"role": "tool" if support.renders_tool_results else "user",
                       "content": f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"}
        adapted.append(message)
    if tools and support.needs_generic_prompt:
        adapted = _with_tools_in_system_message(adapted, tools)
    return adapted


def hermes_call_text(call: dict) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    body = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def _with_tools_in_system_message(messages: list[dict], tools: list[dict]) -> list[dict]:
    listing = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    prompt = _TOOLS_PROMPT.format(tools=listing)
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{prompt}"}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]
