"""From a request's sampling fields (and the server's defaults) to engine SamplingParams."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from shrike.errors import ConfigError
from shrike.sampling.params import SamplingParams
from shrike.server.errors import bad_request, param_of
from shrike.server.protocol import SamplingRequest

# Below this a temperature only overflows the logits; like vLLM, treat it as greedy.
GREEDY_BELOW_TEMPERATURE = 1e-5
# Keys of generation_config.json that become default sampling settings, as vLLM reads them.
_GENERATION_CONFIG_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass(frozen=True)
class SamplingDefaults:
    """What a request gets for a sampling field it leaves out."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = None  # None: the request's own default

    @classmethod
    def for_model(cls, model_dir: Path, generation_config: str) -> "SamplingDefaults":
        """`auto`: the model author's generation_config.json; `vllm`: the OpenAI defaults."""
        path = Path(model_dir) / "generation_config.json"
        if generation_config == "vllm" or not path.is_file():
            return cls()
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ConfigError(f"{path} is unreadable ({e}); fix it or pass --generation-config vllm") from None
        chosen = {key: config[key] for key in _GENERATION_CONFIG_KEYS if isinstance(config.get(key), (int, float))}
        if isinstance(config.get("max_new_tokens"), int):
            chosen["max_tokens"] = config["max_new_tokens"]
        return cls(**chosen)

    def describe(self) -> str:
        return (f"temperature={self.temperature:g} top_p={self.top_p:g} top_k={self.top_k} min_p={self.min_p:g} "
                f"repetition_penalty={self.repetition_penalty:g}"
                + (f" max_tokens={self.max_tokens}" if self.max_tokens is not None else ""))


def token_id_pattern(vocab_size: int) -> str:
    """A regex of the decimal token ids in [0, vocab_size), written without leading zeros (logit_bias keys)."""
    digits = str(vocab_size - 1)
    alternatives = ["0"] + ([f"[1-9][0-9]{{0,{len(digits) - 2}}}"] if len(digits) > 1 else [])
    for i, digit in enumerate(int(d) for d in digits):  # same length, smaller at position i
        lowest = 1 if i == 0 else 0
        if digit > lowest:
            alternatives.append(f"{digits[:i]}[{lowest}-{digit - 1}][0-9]{{{len(digits) - i - 1}}}")
    return "^(" + "|".join([*alternatives, digits]) + ")$"


def _logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    """OpenAI's {"token id": bias in [-100, 100]}."""
    if not bias:
        return None
    pattern = re.compile(token_id_pattern(vocab_size))
    for key, value in bias.items():
        if not pattern.fullmatch(key):
            raise bad_request(f"logit_bias keys must be token ids in [0, {vocab_size}) written in decimal, got "
                              f"{key[:20]!r}", "logit_bias")
        if not -100 <= value <= 100:
            raise bad_request(f"logit_bias values must be in [-100, 100], got {value}", "logit_bias")
    return {int(key): float(value) for key, value in bias.items()}


def build_sampling_params(request: SamplingRequest, defaults: SamplingDefaults, max_tokens: int | None,
                          default_max_tokens: int | None, logprobs: int | None, prompt_logprobs: int | None,
                          max_n: int, vocab_size: int) -> SamplingParams:
    """Raise APIError (400) naming the field for anything the engine would refuse."""
    if request.n > max_n:
        raise bad_request(f"n must be at most {max_n} (the server's --max-num-seqs), got {request.n}", "n")
    stop_token_ids = request.stop_token_ids or []
    if any(not 0 <= t < vocab_size for t in stop_token_ids):
        raise bad_request(f"stop_token_ids must be token ids in [0, {vocab_size})", "stop_token_ids")
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if max_tokens is None:
        max_tokens = defaults.max_tokens if defaults.max_tokens is not None else default_max_tokens

    def default(value, fallback):
        return fallback if value is None else value

    temperature = default(request.temperature, defaults.temperature)
    if 0 < temperature < GREEDY_BELOW_TEMPERATURE:
        temperature = 0.0
    try:
        return SamplingParams(
            max_tokens=max_tokens, min_tokens=request.min_tokens,
            temperature=temperature,
            top_p=default(request.top_p, defaults.top_p), top_k=default(request.top_k, defaults.top_k),
            min_p=default(request.min_p, defaults.min_p), seed=request.seed,
            repetition_penalty=default(request.repetition_penalty, defaults.repetition_penalty),
            presence_penalty=request.presence_penalty, frequency_penalty=request.frequency_penalty,
            stop=stop, stop_token_ids=stop_token_ids, ignore_eos=request.ignore_eos, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs, skip_special_tokens=request.skip_special_tokens, n=request.n,
            include_stop_str_in_output=request.include_stop_str_in_output,
            logit_bias=_logit_bias(request.logit_bias, vocab_size))
    except ValueError as e:
        raise bad_request(str(e), param_of(str(e), set(type(request).model_fields))) from None
