"""What every endpoint needs: the engine loop, the tokenizer, the model's names and limits."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import jinja2

from shrike.engine.async_engine import AsyncEngine
from shrike.sampling.grammar import GrammarCompiler
from shrike.server.errors import APIError, bad_request
from shrike.server.metrics import ServerMetrics
from shrike.server.protocol import ChatMessage
from shrike.server.reasoning import ReasoningParser
from shrike.server.sampling import SamplingDefaults
from shrike.server.shutdown import DrainState
from shrike.token_bytes import TokenBytes
from shrike.tokenizer import Tokenizer


@dataclass
class ServerContext:
    async_engine: AsyncEngine
    tokenizer: Tokenizer
    served_model_names: list[str]
    model_root: str  # where the weights came from
    max_model_len: int
    vocab_size: int  # of the model's embedding, which bounds prompt token ids
    max_num_seqs: int
    defaults: SamplingDefaults
    metrics: ServerMetrics
    api_key: str | None
    grammar_compiler: GrammarCompiler | None = None  # structured outputs and forced tool calls
    tool_parser_class: type | None = None  # --tool-call-parser (a ToolParser subclass)
    enable_auto_tool_choice: bool = False
    reasoning_parser: "ReasoningParser | None" = None  # --reasoning-parser
    created: int = field(default_factory=lambda: int(time.time()))
    drain: DrainState = field(default_factory=DrainState)  # set on SIGTERM/SIGINT
    token_bytes: TokenBytes = field(init=False)

    def __post_init__(self):
        self.token_bytes = TokenBytes(self.tokenizer)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.served_model_names:
            raise APIError(f"the model {name!r} does not exist; this server serves "
                           f"{', '.join(repr(n) for n in self.served_model_names)}", 404,
                           param="model", code="model_not_found")

    def encode(self, text: str, add_special_tokens: bool, param: str) -> list[int]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            # JSON escapes can spell lone surrogates ("\ud800"): valid JSON, but not text.
            raise bad_request(f"{param} is not valid Unicode text ({e.reason})", param) from None
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def encode_chat(self, messages: list[ChatMessage], add_generation_prompt: bool, tools: list[dict] | None,
                    template_kwargs: dict | None) -> list[int]:
        conversation = [_template_message(m, i) for i, m in enumerate(messages)]
        try:
            prompt = self.tokenizer.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt,
                                                        tools=tools, **(template_kwargs or {}))
        except jinja2.TemplateError as e:
            raise bad_request(f"the chat template refused these messages: {_one_line(e)}", "messages") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            raise bad_request(f"the messages cannot be rendered with the chat template: {_one_line(e)}",
                              "messages") from None
        # The template places any BOS itself.
        return self.encode(prompt, add_special_tokens=False, param="messages")

    def check_prompt_length(self, num_tokens: int, param: str) -> None:
        if num_tokens >= self.max_model_len:
            raise bad_request(f"the prompt has {num_tokens} tokens but the maximum context length is "
                              f"{self.max_model_len} tokens (prompt plus output); shorten the prompt", param)

    def tool_parser(self):
        return self.tool_parser_class() if self.tool_parser_class is not None else None

    def check_token_ids(self, ids: list[int], param: str, limit: int | None = None) -> None:
        limit = self.vocab_size if limit is None else limit
        if any(not 0 <= t < limit for t in ids):
            raise bad_request(f"{param} must be token ids in [0, {limit})", param)

    def token_text(self, token_id: int) -> str:
        """One token as logprobs show it: special tokens included, partial UTF-8 as `bytes:\\xf0\\x9f`."""
        return self.token_bytes.text(token_id)


def _template_message(message: ChatMessage, index: int) -> dict:
    as_dict = message.model_dump(exclude_none=True)
    for call in as_dict.get("tool_calls", []):
        # Templates render arguments with tojson, as transformers expects: a dict, not its JSON text.
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            try:
                function["arguments"] = json.loads(function["arguments"])
            except ValueError:
                pass  # not JSON: the template gets the text as sent
    if message.role == "developer":
        as_dict["role"] = "system"  # OpenAI's newer name; chat templates know only "system"
    if isinstance(message.content, list):
        not_text = [part.type for part in message.content if part.type != "text"]
        if not_text:
            raise bad_request(f"messages.{index}.content: only text parts are supported, got {not_text[0]!r}",
                              f"messages.{index}.content")
        as_dict["content"] = "".join(part.text or "" for part in message.content)
    return as_dict


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split()) or type(error).__name__
