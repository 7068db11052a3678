"""Text <-> token ids and chat-template rendering for a Hugging Face-style model directory."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as FastTokenizer

from shrike.template_tools import TemplateToolSupport, adapt_conversation, probe_template

# Named special tokens that transformers hands to every chat template
_SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Older or other clients' names for a message's reasoning; templates read the first
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class Tokenizer:
    def __init__(self, model_dir: Path, chat_template: str | None = None) -> None:
        model_dir = Path(model_dir)
        tokenizer_file = model_dir / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ValueError(f"{model_dir} has no tokenizer.json; Shrike needs a fast (tokenizers) tokenizer")
        self._tokenizer = FastTokenizer.from_file(str(tokenizer_file))
        settings = _read_json(model_dir / "tokenizer_config.json")
        generation = _read_json(model_dir / "generation_config.json")

        self.special_tokens = {
            name: _token_text(settings[name]) for name in _SPECIAL_TOKEN_NAMES if settings.get(name) is not None
        }
        self.bos_token_id: int | None = self._special_token_id("bos_token")
        eos_ids = generation.get("eos_token_id", [])
        self.eos_token_ids: set[int] = set(eos_ids if isinstance(eos_ids, list) else [eos_ids])
        if (eos_token_id := self._special_token_id("eos_token")) is not None:
            self.eos_token_ids.add(eos_token_id)
        self.vocab_size: int = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self._chat_templates = _chat_templates(model_dir, settings)
        self._chat_template_override = chat_template
        self._tool_support_by_template: dict[str, TemplateToolSupport] = {}

    def _special_token_id(self, name: str) -> int | None:
        text = self.special_tokens.get(name)
        return None if text is None else self._tokenizer.token_to_id(text)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # encode_batch releases the GIL while it works (encode holds it): a long prompt tokenized on a
        # server's worker thread then does not stop its event loop.
        return self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def tokenizer_json(self) -> str:
        """The whole tokenizer as tokenizer.json text (grammar backends build their token tries from it)."""
        return self._tokenizer.to_str()

    def token_strings(self) -> list[str]:
        """Each token id's vocabulary entry (byte-level or SentencePiece spelling), "" for unused ids."""
        vocab = self._tokenizer.get_vocab(with_added_tokens=True)
        strings = [""] * (max(vocab.values()) + 1)
        for text, token_id in vocab.items():
            strings[token_id] = text
        return strings

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, documents: list[dict] | None = None,
                            continue_final_message: bool = False, **template_kwargs: Any) -> str:
        """Render a conversation as transformers' apply_chat_template(tokenize=False) does.

        Except where the template would lose tool calling: a message without content gets "" and, if the
        template ignores tools, tool calls or tool results, they are written into the messages (template_tools).
        """
        if not messages:
            raise ValueError("cannot render an empty conversation; send at least one message")
        if tools is not None and not all(isinstance(tool, dict) for tool in tools):
            raise TypeError("tools must be JSON schemas (dicts)")
        source = self._select_chat_template(tools)
        messages = [_normalized_message(message) for message in messages]
        if tools or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
            support = self._tool_support(source)
            messages = adapt_conversation(messages, tools, support)
            if support.needs_generic_prompt:
                tools = None  # they are in the system message now; some such templates refuse a tools argument
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt exclude each other: the first "
                             "continues the last message, the second starts a new one")
        prompt = self._render(source, messages, tools, documents, add_generation_prompt, template_kwargs)
        return _open_final_message(prompt, messages[-1]) if continue_final_message else prompt

    def tool_support(self, tools: list[dict] | None) -> TemplateToolSupport:
        """What the chat template used with these tools does with tools, tool calls and tool results."""
        return self._tool_support(self._select_chat_template(tools))

    def _tool_support(self, source: str) -> TemplateToolSupport:
        if source not in self._tool_support_by_template:
            self._tool_support_by_template[source] = probe_template(
                lambda messages, tools: self._render(source, messages, tools, None, True, {}), source)
        return self._tool_support_by_template[source]

    def _render(self, source: str, messages: list[dict], tools: list[dict] | None, documents: list[dict] | None,
                add_generation_prompt: bool, template_kwargs: dict) -> str:
        return _compiled_template(source).render(
            messages=messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens, **template_kwargs},
        )

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list[dict] | None = None, **template_kwargs: Any) -> list[int]:
        """The rendered prompt's ids; the template places any BOS itself, so encoding adds none (as transformers)."""
        prompt = self.apply_chat_template(messages, add_generation_prompt, tools, **template_kwargs)
        return self.encode(prompt, add_special_tokens=False)

    @property
    def chat_template_adds_bos(self) -> bool:
        """Whether rendered prompts already start with the BOS token, so a second one must not be added."""
        bos = self.special_tokens.get("bos_token")
        if bos is None:
            return False
        return self.apply_chat_template([{"role": "user", "content": "Hi"}]).startswith(bos)

    def _select_chat_template(self, tools: list[dict] | None) -> str:
        if self._chat_template_override is not None:
            return self._chat_template_override
        if tools is not None and "tool_use" in self._chat_templates:
            return self._chat_templates["tool_use"]
        if "default" in self._chat_templates:
            return self._chat_templates["default"]
        if self._chat_templates:
            raise ValueError(
                f"the model has several chat templates ({', '.join(sorted(self._chat_templates))}) and none is "
                "the default; pass one with --chat-template FILE"
            )
        raise ValueError("the model has no chat template; pass one with --chat-template FILE")


class IncrementalDecoder:
    """Turns a stream of token ids into text pieces, holding back bytes until they form whole UTF-8 characters.

    Each new token is decoded together with the few tokens before it, because decoders like
    SentencePiece's drop a word's leading space when it starts the decoded text.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._context_start = 0  # first id of the already-emitted context the next piece is decoded with
        self._emitted_end = 0  # ids before this index are already emitted

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly empty)."""
        self._ids.append(token_id)
        piece = self._pending_text()
        if piece.endswith("\ufffd"):
            return ""  # a multi-byte character is still incomplete
        self._context_start, self._emitted_end = self._emitted_end, len(self._ids)
        return piece

    def flush(self) -> str:
        """Text of tokens still held back at the end of the stream, with broken bytes as U+FFFD."""
        piece = self._pending_text()
        self._context_start = self._emitted_end = len(self._ids)
        return piece

    def _pending_text(self) -> str:
        context = self._ids[self._context_start:self._emitted_end]
        decode = self._tokenizer.decode
        context_text = decode(context, skip_special_tokens=self._skip_special_tokens)
        full_text = decode(self._ids[self._context_start:], skip_special_tokens=self._skip_special_tokens)
        return full_text[len(context_text):]


def _open_final_message(prompt: str, final: dict) -> str:
    """The prompt cut right after the last message's text, so that generation continues it (as transformers)."""
    content = final.get("content")
    text = content if isinstance(content, str) else "".join(
        part.get("text", "") for part in content or [] if isinstance(part, dict))
    if text not in prompt:
        text = text.strip()  # templates that trim messages (Llama 3.1's) show the trimmed text
    if not text or text not in prompt:
        raise ValueError("continue_final_message: the last message's text does not appear in the rendered prompt")
    return prompt[:prompt.rindex(text) + len(text)]


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def _token_text(value: str | dict) -> str:
    # transformers writes AddedToken objects as {"content": ..., ...}
    return value["content"] if isinstance(value, dict) else value


def _chat_templates(model_dir: Path, settings: dict) -> dict[str, str]:
    """Templates by name, from the same places and with the same precedence as transformers."""
    configured = settings.get("chat_template")
    if isinstance(configured, str):
        templates = {"default": configured}
    elif isinstance(configured, list):
        templates = {entry["name"]: entry["template"] for entry in configured}
    else:
        templates = {}
    template_file = model_dir / "chat_template.jinja"
    if template_file.is_file():
        templates["default"] = template_file.read_text(encoding="utf-8")
    for extra_file in sorted((model_dir / "additional_chat_templates").glob("*.jinja")):
        templates[extra_file.stem] = extra_file.read_text(encoding="utf-8")
    return templates


def _normalized_message(message: dict) -> dict:
    # Clients send content=None or tool_calls=None; templates would render "None". An assistant turn that only
    # calls tools has no content at all, which templates that print message['content'] cannot render.
    normalized = {key: value for key, value in message.items() if value is not None}
    normalized.setdefault("content", "")
    reasoning = next((normalized[key] for key in _REASONING_FIELDS if key in normalized), None)
    if reasoning is not None:
        normalized = {"thinking": reasoning, **normalized, "reasoning_content": reasoning}
    return normalized


class _GenerationBlock(jinja2.ext.Extension):
    """Accepts {% generation %}...{% endgeneration %}, which marks assistant text for training; renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()


class _GuardedNamespace(jinja2.utils.Namespace):
    """namespace() that refuses underscore attributes, which could reach interpreter internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attributes = dict(*args, **kwargs)
        for name in attributes:
            _GuardedNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attributes)

    def __setitem__(self, name: str, value: Any) -> None:
        _GuardedNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set namespace attribute {name!r}")


class _DictConstructor:
    """dict() and dict.fromkeys() for templates, without exposing the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Unlike Jinja's own filter, keep <, >, & and non-ASCII text as they are: templates feed a model, not HTML
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _new_environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.globals["namespace"] = _GuardedNamespace
    environment.globals["dict"] = _DictConstructor()
    return environment


_environment = _new_environment()


@lru_cache(maxsize=16)
def _compiled_template(source: str) -> jinja2.Template:
    try:
        return _environment.from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"the chat template does not parse: {error.message} (template line {error.lineno})") from error
