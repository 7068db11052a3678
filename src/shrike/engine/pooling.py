"""Embeddings: how a model's final hidden states become one vector per input.

The pooling comes from the checkpoint when it is a sentence-transformers model (`modules.json` naming a
`Pooling` module, whose `config.json` sets the modes, and maybe a `Normalize` module); otherwise it is
vLLM's choice for a decoder model: the last token's hidden state, normalized to unit length.

Prompts are computed in chunks (chunked prefill), so pooling accumulates: each step the model runner
hands over a `PooledChunk` of the rows it computed, the sequence's `PoolingState` folds it in, and the
vector is finished once the whole prompt has been seen. Sums are kept in float64 so that where the
chunks were cut (which depends on the other requests of a step) does not change the result.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from shrike.errors import ConfigError

# sentence-transformers' Pooling config keys, in the order it concatenates the modes' vectors.
_MODE_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max", "pooling_mode_mean_tokens": "mean",
              "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len", "pooling_mode_weightedmean_tokens": "weightedmean",
              "pooling_mode_lasttoken": "last"}
_ST_POOLING = "sentence_transformers.models.Pooling"
_ST_NORMALIZE = "sentence_transformers.models.Normalize"
_ST_TRANSFORMER = "sentence_transformers.models.Transformer"
RUNNERS = ("auto", "generate", "pooling")
TASKS = ("auto", "generate", "embed")


@dataclass(frozen=True)
class Pooler:
    """How a model pools: its modes (concatenated in this order), and whether the vector is normalized."""

    modes: tuple[str, ...]
    normalize: bool
    source: str  # where the choice came from, for the startup line and errors
    matryoshka: bool = False  # config.json says a vector's leading dimensions are an embedding too

    @property
    def needs_every_row(self) -> bool:
        """Whether every prompt row's hidden state is read (mean, max, ...), not only the first or last."""
        return any(mode not in ("cls", "last") for mode in self.modes)

    def describe(self) -> str:
        return f"pooling {'+'.join(self.modes)}{', normalized' if self.normalize else ''} ({self.source})"


def load_pooler(model_dir: Path) -> Pooler:
    """The pooling `model_dir` declares (sentence-transformers), else last-token pooling, normalized.
    ConfigError (one line) for a sentence-transformers pipeline this engine cannot run."""
    config = _read_json(model_dir / "config.json") or {}
    matryoshka = bool(config.get("is_matryoshka") or config.get("matryoshka_dimensions"))
    modules = _read_json(model_dir / "modules.json")
    if modules is None:
        return Pooler(("last",), True, "last token, as vLLM pools decoder models", matryoshka)
    if not isinstance(modules, list):
        raise ConfigError(f"{model_dir / 'modules.json'} is not a list of sentence-transformers modules")
    modes: tuple[str, ...] | None = None
    normalize = False
    for module in modules:
        kind, path = module.get("type", ""), module.get("path", "")
        if kind == _ST_TRANSFORMER:
            continue
        if kind == _ST_POOLING:
            modes = _pooling_modes(model_dir / path / "config.json")
        elif kind == _ST_NORMALIZE:
            normalize = True
        else:
            raise ConfigError(f"modules.json names a {kind!r} module; Shrike runs sentence-transformers pipelines "
                              "of a Transformer, a Pooling and a Normalize module only")
    if modes is None:
        raise ConfigError(f"{model_dir / 'modules.json'} has no Pooling module")
    return Pooler(modes, normalize, "sentence-transformers modules.json", matryoshka)


def _pooling_modes(path: Path) -> tuple[str, ...]:
    settings = _read_json(path)
    if not isinstance(settings, dict):
        raise ConfigError(f"{path} is missing or not a JSON object")
    if "pooling_mode" in settings and not any(settings.get(k) for k in _MODE_KEYS):  # the short form
        short = {"cls": "cls", "max": "max", "mean": "mean", "mean_sqrt_len_tokens": "mean_sqrt_len",
                 "weightedmean": "weightedmean", "lasttoken": "last"}
        if settings["pooling_mode"] not in short:
            raise ConfigError(f"{path}: pooling_mode {settings['pooling_mode']!r} is not one Shrike knows")
        return (short[settings["pooling_mode"]],)
    modes = tuple(mode for key, mode in _MODE_KEYS.items() if settings.get(key))
    if not modes:
        raise ConfigError(f"{path} turns on no pooling mode")
    return modes


def _read_json(path: Path):
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} cannot be read as JSON ({e})") from None


@dataclass
class PoolingParams:
    """What an embedding request asks for beyond its tokens (vLLM's PoolingParams)."""

    dimensions: int | None = None  # keep the leading dimensions (Matryoshka models), then normalize
    n: int = 1  # one vector per input: the engine counts sequences by n, as for generation

    def __post_init__(self):
        if self.dimensions is not None and (isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int)
                                            or self.dimensions < 1):
            raise ValueError(f"dimensions must be a whole number of at least 1, got {self.dimensions!r}")


@dataclass
class PooledChunk:
    """What one step computed of a sequence's pooling: its rows' contributions, from prompt position `start`."""

    start: int
    count: int
    sums: dict[str, torch.Tensor] = field(default_factory=dict)  # float64 (hidden,) per accumulated quantity


def pool_chunk(pooler: Pooler, hidden: torch.Tensor, start: int, count: int, first: bool, last: bool) -> PooledChunk:
    """hidden: the rows this step computed that the pooler reads (every row of the chunk when it needs every
    row, else the first and/or last as flagged), in the model's dtype."""
    rows = hidden.to(torch.float64)
    chunk = PooledChunk(start, count)
    if pooler.needs_every_row:
        if any(m in ("mean", "mean_sqrt_len") for m in pooler.modes):
            chunk.sums["sum"] = rows.sum(0)
        if "max" in pooler.modes:
            chunk.sums["max"] = rows.max(0).values
        if "weightedmean" in pooler.modes:  # sentence-transformers weighs position p (from 0) by p + 1
            weights = torch.arange(start + 1, start + count + 1, dtype=torch.float64)
            chunk.sums["weighted"] = (rows * weights[:, None]).sum(0)
        if first:
            chunk.sums["cls"] = rows[0]
        if last:
            chunk.sums["last"] = rows[-1]
    else:
        if first and "cls" in pooler.modes:
            chunk.sums["cls"] = rows[0]
        if last and "last" in pooler.modes:
            chunk.sums["last"] = rows[-1]
    return chunk


class PoolingState:
    """A pooled sequence's running totals; restarted when its prompt is computed again from position 0
    (after preemption: with only pooled sequences the scheduler never needs to, as at most one of them is part-way
    through its prompt at a time, but a preempted sequence is recomputed from scratch and its totals must be too)."""

    def __init__(self, pooler: Pooler, params: PoolingParams):
        self.pooler, self.params = pooler, params
        self.sums: dict[str, torch.Tensor] = {}
        self.count = 0

    def add(self, chunk: PooledChunk) -> None:
        if chunk.start == 0:
            self.sums, self.count = {}, 0
        for name, value in chunk.sums.items():
            if name not in self.sums or name in ("cls", "last"):
                self.sums[name] = value
            elif name == "max":
                self.sums[name] = torch.maximum(self.sums[name], value)
            else:
                self.sums[name] = self.sums[name] + value
        self.count = chunk.start + chunk.count

    def vector(self) -> list[float]:
        """The embedding, once every prompt token has been added."""
        n = self.count
        parts = []
        for mode in self.pooler.modes:
            if mode == "mean":
                parts.append(self.sums["sum"] / n)
            elif mode == "mean_sqrt_len":
                parts.append(self.sums["sum"] / math.sqrt(n))
            elif mode == "weightedmean":
                parts.append(self.sums["weighted"] / (n * (n + 1) / 2))
            else:
                parts.append(self.sums[mode])
        vector = torch.cat(parts)
        if self.params.dimensions is not None:
            vector = vector[:self.params.dimensions]
        if self.pooler.normalize:
            vector = vector / vector.norm().clamp_min(1e-12)
        return vector.to(torch.float32).tolist()


def runner_asked(runner: str, task: str) -> str:
    """--runner and --task (vLLM's older name: embed is pooling) as one choice: auto, generate or pooling."""
    from_task = {"auto": "auto", "generate": "generate", "embed": "pooling"}[task]
    if "auto" not in (runner, from_task) and runner != from_task:
        raise ConfigError(f"--runner {runner} and --task {task} disagree; give one of them")
    return from_task if runner == "auto" else runner


def resolve_runner(asked: str, model_dir: Path) -> str:
    """auto: pooling for a sentence-transformers checkpoint (modules.json), else generation."""
    if asked != "auto":
        return asked
    return "pooling" if (model_dir / "modules.json").is_file() else "generate"
