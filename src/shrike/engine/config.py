"""Engine settings, declared once.

Each field of EngineConfig is one setting: its default, its check and its help live here, and from them come
the flags of `shrike serve`, `generate`, `eval-ppl` and `doctor` (`--max-model-len` for max_model_len) and
the keyword arguments of `LLM(...)`. Every front end hands the values it got (text from a command line,
Python values from `LLM`) to EngineConfig, whose checks turn them into values or refuse them with one line
that names the flag, so a setting is spelled, defaulted and refused the same way everywhere.
"""
from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from shrike.errors import ConfigError
from shrike.layers.kv_dtypes import KV_CACHE_DTYPES
from shrike.layers.lm_head import LM_HEAD_QUANT
from shrike.model.gguf_linear import GGUF_WEIGHTS
from shrike.engine.pooling import RUNNERS, TASKS
from shrike.platform.cpulist import parse_cpu_list
from shrike.quantization.backends import ACTIVATION_QUANT, KERNEL_BACKENDS
from shrike.speculative.config import SpeculativeConfig, parse_speculative_config

Check = Callable[[str, Any], Any]  # (flag, value as given) -> the value to run with; ConfigError when wrong


@dataclass(frozen=True)
class Setting:
    help: str
    check: Check
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    is_flag: bool = True  # False: a Python-only argument (LLM, tests), not on any command line
    nargs: str | None = None  # "+": a flag followed by one or more values


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


# Checks. They take text (a command line) or Python values (LLM) alike.

def _choice(choices: tuple[str, ...]) -> Check:
    def check(flag: str, value: Any) -> str:
        if value not in choices:
            raise ConfigError(f"{flag} {value!r} is not supported; use {', '.join(choices)}")
        return value
    return check


def _whole_number(minimum: int) -> Check:
    def check(flag: str, value: Any) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"{flag} {value} is not a whole number")
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(f"{flag} {value} is not a whole number") from None
        if number < minimum:
            raise ConfigError(f"{flag} {number} is below the minimum of {minimum}")
        return number
    return check


def _gib(flag: str, value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not 0 < number < math.inf:
        raise ConfigError(f"{flag} {value}: give a size in GiB above 0, or leave it out")
    return number


def _on_off(flag: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{flag} {value!r} is not True or False")
    return value


def _optional_text(flag: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{flag} {value!r} is not text")
    return value


def _model(flag: str, value: Any) -> str | None:
    if isinstance(value, Path):
        return str(value)
    return _optional_text("model", value)


def _chat_template(flag: str, value: Any) -> str | None:
    value = _optional_text(flag, value)
    if value is None or Path(value).is_file() or "{{" in value or "{%" in value:
        return value
    raise ConfigError(f"{flag} {value!r} is neither a file nor a Jinja template")


def _cpu_list(flag: str, value: Any) -> str | None:
    value = _optional_text(flag, value)
    if value is not None:
        try:
            parse_cpu_list(value)
        except ConfigError as error:
            raise ConfigError(f"{flag}: {error}") from None
    return value


def _lora_modules(flag: str, value: Any) -> tuple[tuple[str, str], ...]:
    """NAME=PATH texts (a command line), or {name: path} (LLM) -> ((name, path), ...)."""
    if isinstance(value, dict):
        value = [f"{name}={path}" for name, path in value.items()]
    if isinstance(value, str):
        value = [value]
    pairs = []
    for item in value or ():
        if isinstance(item, tuple):
            item = "=".join(item)
        name, sep, path = str(item).partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"{flag} {item!r}: give each adapter as NAME=PATH")
        pairs.append((name, path))
    return tuple(pairs)


def _speculative(flag: str, value: Any) -> SpeculativeConfig | None:
    return parse_speculative_config(value)


def _setting(default: Any, help: str, check: Check | None, choices: tuple[str, ...] | None = None,
             metavar: str | None = None, is_flag: bool = True, nargs: str | None = None) -> Any:
    """A field of EngineConfig with its setting; check None: one of `choices`."""
    setting = Setting(help, check or _choice(choices), choices, metavar, is_flag, nargs)
    return field(default=default, metadata={"setting": setting})


@dataclass
class EngineConfig:
    model: str | None = _setting(
        None, "model directory (Hugging Face layout) or .gguf file; default: SmolLM2-135M-Instruct", _model)
    dtype: str = _setting(
        "auto", "weight and activation dtype (default: the checkpoint's; float32 for a GGUF file run natively, "
        "as llama.cpp computes, when every matrix of the file has a kernel)", None,
        choices=("auto", "float32", "bfloat16"))
    max_model_len: int | None = _setting(
        None, "maximum tokens per sequence, prompt plus output (default: the model's)", _whole_number(2))
    max_num_seqs: int = _setting(64, "sequences computed together in one step (default: 64)", _whole_number(1))
    # Step budget. 512 prefills as fast as 2048 (same tok/s on 2B W4A8 and SmolLM2: the tile kernels are as
    # efficient at 512 rows), but prompts that arrive together finish one after another, so most get their
    # first token sooner (8 x 256 tokens on SmolLM2: median first token 0.61x), and running streams stall
    # for at most a 512-token step while a long prompt prefills.
    max_num_batched_tokens: int = _setting(512, "tokens computed in one step (default: 512)", _whole_number(1))
    block_size: int = _setting(16, "tokens per KV-cache block", _whole_number(1), is_flag=False)
    kv_cache_space: float | None = _setting(
        None, "KV-cache size in GiB (default: sized from free memory)", _gib, metavar="GIB")
    kv_cache_dtype: str = _setting(
        "auto", "KV-cache element type (default: the activations' dtype); int8: values quantized per token and "
        "KV head, about half the bytes of bfloat16", None, choices=KV_CACHE_DTYPES)
    chat_template: str | None = _setting(
        None, "Jinja chat template file (or string) replacing the model's", _chat_template)
    enable_prefix_caching: bool = _setting(
        True, "reuse the KV cache of equal prompt prefixes across requests (default: on)", _on_off)
    cpu_threads: int | None = _setting(None, "compute threads (default: one per fast core)", _whole_number(1))
    cpu_bind: str | None = _setting(
        None, "cores to compute on, e.g. 0,1,6-11 (default: the fastest class of usable cores)", _cpu_list,
        metavar="LIST")
    kernel_backend: str = _setting(
        "auto", "every op on the compiled kernels, as one compiled forward per step (auto), or on its PyTorch "
        "reference in the eager Python model (reference)", None, choices=KERNEL_BACKENDS)
    lm_head_quant: str = _setting(
        "none", "none: the lm_head keeps the checkpoint's precision (default); int8: quantized per vocabulary row "
        "at load (half the bytes of bf16, slightly less accurate)", None, choices=LM_HEAD_QUANT)
    activation_quant: str = _setting(
        "none", "weight-only (W4A16 / W8A16) checkpoints: none keeps activations in 16 bits (default, accurate); "
        "int8 quantizes them per token for the W4A8 / W8A8 int8 kernels (faster, less accurate)", None,
        choices=ACTIVATION_QUANT)
    gguf_weights: str = _setting(
        "native", "a .gguf model: native runs its linear layers from the file's quant blocks on the int8 kernels "
        "(default; about the file's memory); bf16 runs the whole bf16 conversion", None, choices=GGUF_WEIGHTS)
    speculative_config: str | dict | SpeculativeConfig | None = _setting(
        None, "speculative decoding, vLLM's JSON: '{\"method\": \"ngram\", \"num_speculative_tokens\": 5, "
        "\"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}' proposes continuations of earlier text, "
        "'{\"model\": DIR, \"num_speculative_tokens\": 4}' drafts with a smaller model sharing the tokenizer "
        "(exact: outputs equal those without it) (default: off)", _speculative, metavar="JSON")
    enable_lora: bool = _setting(
        False, "serve LoRA adapters beside the base model, chosen per request by model=NAME (default: off)", _on_off)
    lora_modules: tuple = _setting(
        (), "LoRA adapters to serve, PEFT directories given as NAME=PATH (with --enable-lora)", _lora_modules,
        metavar="NAME=PATH", nargs="+")
    max_loras: int = _setting(
        1, "LoRA adapters resident at once, each in its slot; a step mixes up to this many (default: 1)",
        _whole_number(1))
    max_lora_rank: int = _setting(16, "largest LoRA rank an adapter may have (default: 16)", _whole_number(1))
    allow_runtime_lora: bool = _setting(
        False, "let clients load and unload LoRA adapters at run time (/v1/load_lora_adapter, "
        "/v1/unload_lora_adapter; default: off)", _on_off)
    runner: str = _setting(
        "auto", "generate: text generation; pooling: an embedding model (/v1/embeddings, LLM.embed), pooled as its "
        "sentence-transformers modules.json says or else from the last token, normalized (default auto: pooling "
        "when the model directory has a modules.json)", None, choices=RUNNERS)
    task: str = _setting(
        "auto", "vLLM's older name for --runner: embed is --runner pooling, generate is --runner generate", None,
        choices=TASKS)
    progress: bool = _setting(True, "show load progress bars", _on_off, is_flag=False)
    compiled_forward: bool = _setting(
        True, "False: always the eager Python forward (the reference path)", _on_off, is_flag=False)

    def __post_init__(self) -> None:
        for name, setting in engine_settings().items():
            setattr(self, name, setting.check(flag_name(name), getattr(self, name)))


def engine_settings() -> dict[str, Setting]:
    """Every engine setting by field name, in declaration order."""
    return {f.name: f.metadata["setting"] for f in fields(EngineConfig)}


def engine_flags() -> dict[str, Setting]:
    """The settings that are command-line flags (all but the positional model and the Python-only ones)."""
    return {name: s for name, s in engine_settings().items() if s.is_flag and name != "model"}


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The positional MODEL and every engine flag. Values stay as given: EngineConfig checks them, so the
    command line and LLM(...) refuse a value with the same words."""
    defaults = EngineConfig.__dataclass_fields__
    parser.add_argument("model", nargs="?", default=None, help=engine_settings()["model"].help)
    group = parser.add_argument_group("engine settings", "the same in serve, generate, eval-ppl, doctor and "
                                      "as keyword arguments of LLM(...)")
    for name, setting in engine_flags().items():
        default = defaults[name].default
        if isinstance(default, bool):
            group.add_argument(flag_name(name), action=argparse.BooleanOptionalAction, default=default,
                               help=setting.help)
        else:
            metavar = "{" + ",".join(setting.choices) + "}" if setting.choices else setting.metavar
            group.add_argument(flag_name(name), default=default, metavar=metavar, help=setting.help,
                               **({"nargs": setting.nargs} if setting.nargs else {}))


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig a command line asks for; ConfigError (one line) when a value is wrong. The checked
    values are left in `args` as well, for the code that reads a flag from there (the server's queue length
    is counted in --max-num-seqs)."""
    config = EngineConfig(model=args.model, **{name: getattr(args, name) for name in engine_flags()})
    for name in ("model", *engine_flags()):
        setattr(args, name, getattr(config, name))
    return config
