"""What the linear layers of an unquantized model see on a calibration text.

The model runs in fp32 on the text, cut into chunks of 512 tokens each started with BOS when the
tokenizer asks for one (as `shrike eval-ppl` scores), and every linear layer records its inputs:
per input channel the largest magnitude and the mean absolute value (for smoothing and AWQ scaling) and
the mean square (for weighting the scale search), for GPTQ the sum of outer products x x^T, and for the
smoothing-factor search (shrike.quantization.smoothing) up to SAMPLE_ROWS of the inputs themselves.
Layers reading the same input (q/k/v, gate/up) record once, under the first one's checkpoint prefix.

sequential_calibration walks the decoder layer by layer instead, as llm-compressor's sequential pipeline
and the GPTQ paper do: each layer records its inputs as produced by the earlier layers with their weights
already replaced by their quantized values, then its own weights are replaced before the next layer runs.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from shrike.errors import ConfigError
from shrike.eval_ppl import scoring_bos, sequence_logits
from shrike.executor.step import EagerStep
from shrike.layers.attention import KVCache
from shrike.layers.linear import DenseLinear
from shrike.model.config import ModelConfig
from shrike.model.weights import CheckpointTensors
from shrike.ops import builtin_op_table, weight_for_op
from shrike.plugins import build_registry
from shrike.tokenizer import Tokenizer

CONTEXT = 512
# Input rows kept per layer for the factor search: enough to rank candidate factors, few enough to hold
# every layer's in memory (SmolLM2-135M: 30 layers x 4 inputs x 1024 rows, about 0.5 GB in fp32).
SAMPLE_ROWS = 1024


@dataclass
class InputStatistics:
    absmax: torch.Tensor  # (K,) max |x_k|
    square_sum: torch.Tensor  # (K,) sum of x_k^2
    gram: torch.Tensor | None  # (K, K) sum of x x^T, or None when not asked for
    abs_sum: torch.Tensor  # (K,) sum of |x_k|
    rows: list[torch.Tensor] | None = None  # the inputs seen, (rows, K) each, or None when not asked for
    tokens: int = 0

    @property
    def power(self) -> torch.Tensor:
        """(K,) mean of x_k^2."""
        return self.square_sum / max(self.tokens, 1)

    @property
    def mean_abs(self) -> torch.Tensor:
        """(K,) mean of |x_k|."""
        return self.abs_sum / max(self.tokens, 1)

    def samples(self) -> torch.Tensor:
        """(<= SAMPLE_ROWS, K) input rows spread evenly over the calibration text."""
        rows = torch.cat(self.rows)
        return rows[torch.linspace(0, len(rows) - 1, min(len(rows), SAMPLE_ROWS)).long()]

    def record(self, x: torch.Tensor) -> None:
        x = x.float()
        self.absmax = torch.maximum(self.absmax, x.abs().amax(dim=0))
        self.abs_sum += x.abs().sum(dim=0)
        self.square_sum += x.square().sum(dim=0)
        if self.gram is not None:
            self.gram += x.T @ x
        if self.rows is not None:
            self.rows.append(x.clone())
        self.tokens += x.shape[0]


def _empty_statistics(in_features: int, gram: bool, samples: bool) -> InputStatistics:
    return InputStatistics(torch.zeros(in_features), torch.zeros(in_features),
                           torch.zeros(in_features, in_features) if gram else None, torch.zeros(in_features),
                           [] if samples else None)


class _RecordingLinear(DenseLinear):
    seen: InputStatistics | None = None  # None: run without recording
    op: Callable  # the dense_linear op, which decides the weight's form
    tensors: CheckpointTensors  # where the weights not replaced come from

    def __call__(self, step, x, rows):
        if self.seen is not None:
            self.seen.record(x)  # the model runs eagerly here (EagerStep): x is (rows, K)
        return super().__call__(step, x, rows)

    def replace_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """weights: checkpoint prefix -> (out_features, K) for some of the fused parts; the others keep the
        checkpoint's."""
        parts = [weights[prefix].float() if prefix in weights
                 else self.tensors.get(f"{prefix}.weight", (rows, self.in_features), torch.float32)
                 for prefix, rows in self.checkpoint_parts]
        self.weight = weight_for_op(torch.cat(parts).contiguous(), self.op)  # (out_features, K)


def _recording_model(model_dir: Path, config: ModelConfig):
    """The model in fp32 with every linear a _RecordingLinear, and those linears by their first prefix."""
    ops = builtin_op_table()
    linears: dict[str, _RecordingLinear] = {}

    def recording_linear(tensors, prefixes, in_features, out_features, bias):
        layer = _RecordingLinear.load(tensors, prefixes, in_features, out_features, bias, torch.float32,
                                      ops.dense_linear)
        layer.op, layer.tensors = ops.dense_linear, tensors
        linears[prefixes[0]] = layer
        return layer

    architecture = build_registry().architecture(config.architecture).target
    model = architecture(config, CheckpointTensors(model_dir), torch.float32, make_linear=recording_linear, ops=ops)
    return model, linears


def generated_text(model_dir: Path, sequences: int, seed: int, tokens: int = CONTEXT - 1) -> str:
    """sequences samples of the model itself at temperature 1, each `tokens` tokens from BOS (or EOS, which
    separates documents in the training text of models without a BOS), sequence i seeded with seed + i; joined by
    blank lines. Calibration data without a download: what the model expects to see, in its own proportions."""
    from shrike.llm import LLM
    from shrike.sampling.params import SamplingParams

    tokenizer = Tokenizer(model_dir)
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else min(tokenizer.eos_token_ids, default=None)
    if start is None:
        raise ConfigError(f"{model_dir}: the tokenizer names no BOS or EOS token to start generated calibration from")
    llm = LLM(str(model_dir), cpu_threads=min(2, torch.get_num_threads()), max_model_len=tokens + 1)
    params = [SamplingParams(max_tokens=tokens, temperature=1.0, seed=seed + i, ignore_eos=True)
              for i in range(sequences)]
    outputs = llm.generate([{"prompt_token_ids": [start]}] * sequences, params, use_tqdm=False)
    return "\n\n".join(out.outputs[0].text for out in outputs)


def calibration_chunks(model_dir: Path, text: str) -> list[list[int]]:
    """text as the token sequences the model runs on: CONTEXT tokens each, BOS first when scoring adds one."""
    tokenizer = Tokenizer(model_dir)
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) < 2:
        raise ConfigError("the calibration text has fewer than 2 tokens")
    bos, _ = scoring_bos(tokenizer, model_dir)
    prefix = [] if bos is None else [bos]
    stride = CONTEXT - len(prefix)
    return [prefix + ids[start:start + stride] for start in range(0, len(ids), stride)]


def input_statistics(model_dir: Path, text: str, gram: bool = False, samples: bool = False
                     ) -> dict[str, InputStatistics]:
    """Every linear layer's InputStatistics on text, keyed by its (first) checkpoint prefix; gram and samples:
    also record x x^T (GPTQ) and the input rows (factor search)."""
    config = ModelConfig.from_dir(model_dir)
    model, linears = _recording_model(model_dir, config)
    stats = {}
    for prefix, layer in linears.items():
        layer.seen = stats[prefix] = _empty_statistics(layer.in_features, gram, samples)
    for chunk in calibration_chunks(model_dir, text):
        sequence_logits(model, chunk)
    return stats


class _LayerInputs(Exception):
    """Raised by the last decoder layer's stand-in: the layer inputs are captured, the rest is not needed."""


@dataclass
class _ChunkState:
    """One calibration chunk between two decoder layers: what the next layer's call takes."""
    step: EagerStep
    delta: torch.Tensor | None  # (T, hidden) the previous layer's output, not yet added; None before layer 0
    residual: torch.Tensor  # (T, hidden)
    rope: list[tuple[torch.Tensor, torch.Tensor]]  # (cos, sin) each layer is called with


class _Capture:
    """Stands in for decoder layer `index` during one forward: records the call's inputs, computes nothing."""

    def __init__(self, index: int, last: bool, state: dict):
        self.index, self.last, self.state = index, last, state

    def __call__(self, step, delta, residual, cos, sin, cache):
        if self.index == 0:
            self.state.update(step=step, residual=residual.clone())
        self.state.setdefault("rope", []).append((cos, sin))
        if self.last:
            raise _LayerInputs
        return torch.zeros_like(residual)


def _first_layer_inputs(model, chunk: list[int]) -> _ChunkState:
    layers, state = model.layers, {}
    model.layers = [_Capture(i, i == len(layers) - 1, state) for i in range(len(layers))]
    try:
        sequence_logits(model, chunk)
    except _LayerInputs:
        pass
    finally:
        model.layers = layers
    return _ChunkState(state["step"], None, state["residual"], state["rope"])


def sequential_calibration(model_dir: Path, text: str,
                           quantize_layer: Callable[[int, dict[str, InputStatistics]], dict[str, torch.Tensor]]
                           ) -> None:
    """For each decoder layer i in order: record the input statistics (with x x^T) of its linears on text, the
    earlier layers running with the weights quantize_layer returned for them; quantize_layer(i, stats) returns
    checkpoint prefix -> dequantized weight (N, K) for the layers it quantized, which replace the originals."""
    config = ModelConfig.from_dir(model_dir)
    model, linears = _recording_model(model_dir, config)
    states = [_first_layer_inputs(model, chunk) for chunk in calibration_chunks(model_dir, text)]
    block = states[0].step.block_size
    # One cache for every layer and chunk: a chunk's call writes all its keys and values before attending.
    cache = KVCache(-(-CONTEXT // block), block, config.num_kv_heads, config.head_dim, torch.float32)
    for index, layer in enumerate(model.layers):
        prefix = f"model.layers.{index}."
        owned = {p: linear for p, linear in linears.items() if p.startswith(prefix)}
        stats = {}
        for p, linear in owned.items():
            linear.seen = stats[p] = _empty_statistics(linear.in_features, gram=True, samples=False)
        for state in states:  # recording pass: the residual is updated in place, so on a copy
            layer(state.step, state.delta, state.residual.clone(), *state.rope[index], cache)
        for linear in owned.values():
            linear.seen = None
        quantized = quantize_layer(index, stats)
        for linear in owned.values():
            linear.replace_weights(quantized)
        for state in states:  # the next layer's inputs, from this layer quantized
            state.delta = layer(state.step, state.delta, state.residual, *state.rope[index], cache)
