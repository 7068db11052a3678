"""What every endpoint needs: the engine loop, the tokenizer, the model's names and limits."""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import jinja2

from shrike.engine.async_engine import AsyncEngine
from shrike.engine.lora import LoRARequest
from shrike.sampling.grammar import GrammarCompiler
from shrike.server.errors import APIError, bad_request, raised_by_shrike
from shrike.server.metrics import ServerMetrics
from shrike.server.protocol import ChatMessage
from shrike.server.reasoning import ReasoningParser
from shrike.server.sampling import SamplingDefaults
from shrike.server.shutdown import DrainState
from shrike.token_bytes import TokenBytes
from shrike.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# Keyword arguments the server passes to the chat template itself; chat_template_kwargs may not repeat them.
RESERVED_TEMPLATE_ARGUMENTS = ("messages", "tools", "add_generation_prompt")
# Prompts are tokenized on these threads, never on the event loop: a megabyte of text takes seconds, and the
# tokenizer releases the GIL while it works, so /health and running streams keep their pace meanwhile.
TOKENIZE_THREADS = 2


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
    # More characters than this cannot fit the context, as no token of the vocabulary spans more than
    # longest_token_chars characters. Checked before any tokenizing, so it bounds the tokenizer's work.
    max_prompt_chars: int = field(init=False)
    longest_token_chars: int = field(init=False)
    tokenize_pool: ThreadPoolExecutor = field(init=False)

    def __post_init__(self):
        self.token_bytes = TokenBytes(self.tokenizer)
        self.longest_token_chars = max(1, max(len(text) for text in self.tokenizer.token_strings()))
        self.max_prompt_chars = self.max_model_len * self.longest_token_chars
        self.tokenize_pool = ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="shrike-tokenize")

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    @property
    def lora_adapters(self) -> list[str]:
        """Names of the LoRA adapters served beside the base model (--lora-modules and loaded at run time)."""
        lora = self.async_engine.engine.lora
        return [] if lora is None else list(lora.adapters)

    def check_model(self, name: str | None) -> LoRARequest | None:
        """The LoRA adapter the request's `model` names, None for the base model; 404 naming what is served when
        it is neither."""
        if name is None or name in self.served_model_names:
            return None
        lora = self.async_engine.engine.lora
        registered = None if lora is None else lora.adapters.get(name)
        if registered is None:
            raise APIError(f"the model {name!r} does not exist; this server serves "
                           f"{', '.join(repr(n) for n in self.served_model_names + self.lora_adapters)}", 404,
                           param="model", code="model_not_found")
        return LoRARequest(name, registered.cache_key[1], str(registered.adapter.path))

    async def tokenize(self, text: str, add_special_tokens: bool, param: str) -> list[int]:
        """`encode` on a tokenizing thread."""
        return await self.off_loop(self.encode, text, add_special_tokens, param)

    async def tokenize_chat(self, messages: list[ChatMessage], add_generation_prompt: bool,
                            tools: list[dict] | None, template_kwargs: dict | None) -> list[int]:
        """`encode_chat` on a tokenizing thread."""
        return await self.off_loop(self.encode_chat, messages, add_generation_prompt, tools, template_kwargs)

    async def off_loop(self, function, *args):
        """function(*args) on a tokenizing thread."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenize_pool, functools.partial(function, *args))

    def check_prompt_chars(self, num_chars: int, param: str) -> None:
        if num_chars > self.max_prompt_chars:
            raise APIError(f"{param} has {num_chars} characters, more than the maximum context length of "
                           f"{self.max_model_len} tokens can hold (no token of this model spans more than "
                           f"{self.longest_token_chars} characters); shorten it", 400, param=param,
                           code="prompt_too_long")

    def encode(self, text: str, add_special_tokens: bool, param: str) -> list[int]:
        """Blocks for as long as the text takes to tokenize: from a coroutine, await `tokenize` instead."""
        self.check_prompt_chars(len(text), param)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            # JSON escapes can spell lone surrogates ("\ud800"): valid JSON, but not text.
            raise bad_request(f"{param} is not valid Unicode text ({e.reason})", param) from None
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def encode_chat(self, messages: list[ChatMessage], add_generation_prompt: bool, tools: list[dict] | None,
                    template_kwargs: dict | None) -> list[int]:
        """Blocks for as long as rendering and tokenizing take: from a coroutine, await `tokenize_chat` instead."""
        reserved = [name for name in RESERVED_TEMPLATE_ARGUMENTS if name in (template_kwargs or {})]
        if reserved:
            raise bad_request(f"chat_template_kwargs may not set {reserved[0]!r}: the server passes "
                              f"{', '.join(RESERVED_TEMPLATE_ARGUMENTS)} to the template itself from the request's "
                              "own fields", "chat_template_kwargs")
        self.check_prompt_chars(sum(_content_chars(m) for m in messages), "messages")
        conversation = [_template_message(m, i) for i, m in enumerate(messages)]
        try:
            prompt = self.tokenizer.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt,
                                                        tools=tools, **(template_kwargs or {}))
        except Exception as e:  # noqa: BLE001 - whatever a template does with odd input is the client's 400
            raise bad_request(_template_failure(e), "messages") from None
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


def _content_chars(message: ChatMessage) -> int:
    if isinstance(message.content, str):
        return len(message.content)
    return sum(len(part.text or "") for part in message.content or [])


def _template_failure(error: Exception) -> str:
    """The client's view of a failed rendering: only words written for people, never Python's own."""
    if type(error) is jinja2.TemplateError:
        # raise_exception() in the template: its author's message to the user
        return f"the chat template refused these messages: {_one_line(error)}"
    if isinstance(error, (ValueError, TypeError)) and raised_by_shrike(error):
        return f"the messages cannot be rendered with the chat template: {_one_line(error)}"
    logger.info("the chat template failed on a request's messages: %s: %s", type(error).__name__, _one_line(error))
    return ("these messages cannot be rendered with the chat template (a field or value it expects is missing or "
            "of another type); check the roles, contents and chat_template_kwargs against this model's template")


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split()) or type(error).__name__
