"""What the linear layers of an unquantized model see on a calibration text.

The model runs in fp32 on the text, cut into chunks of 512 tokens each started with BOS when the
tokenizer asks for one (as `shrike eval-ppl` scores), and every linear layer records its inputs:
per input channel the largest magnitude and the mean absolute value (for smoothing and AWQ scaling) and
the mean square (for weighting the scale search), for GPTQ the sum of outer products x x^T, and for the
smoothing-factor search (shrike.quantization.smoothing) up to SAMPLE_ROWS of the inputs themselves.
Layers reading the same input (q/k/v, gate/up) record once, under the first one's checkpoint prefix.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from shrike.errors import ConfigError
from shrike.eval_ppl import scoring_bos, sequence_logits
from shrike.layers.linear import DenseLinear
from shrike.model.config import ModelConfig
from shrike.model.weights import CheckpointTensors
from shrike.ops import builtin_op_table
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


class _RecordingLinear(DenseLinear):
    seen: InputStatistics

    def __call__(self, step, x, rows):
        self.seen.record(x)  # the model runs eagerly here (sequence_logits): x is (rows, K)
        return super().__call__(step, x, rows)


def input_statistics(model_dir: Path, text: str, gram: bool = False, samples: bool = False
                     ) -> dict[str, InputStatistics]:
    """Every linear layer's InputStatistics on text, keyed by its (first) checkpoint prefix; gram and samples:
    also record x x^T (GPTQ) and the input rows (factor search)."""
    config = ModelConfig.from_dir(model_dir)
    stats: dict[str, InputStatistics] = {}

    ops = builtin_op_table()

    def recording_linear(tensors, prefixes, in_features, out_features, bias):
        layer = _RecordingLinear.load(tensors, prefixes, in_features, out_features, bias, torch.float32,
                                      ops.dense_linear)
        layer.seen = stats[prefixes[0]] = InputStatistics(
            torch.zeros(in_features), torch.zeros(in_features),
            torch.zeros(in_features, in_features) if gram else None, torch.zeros(in_features), [] if samples else None)
        return layer

    architecture = build_registry().architecture(config.architecture).target
    model = architecture(config, CheckpointTensors(model_dir), torch.float32, make_linear=recording_linear, ops=ops)
    tokenizer = Tokenizer(model_dir)
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) < 2:
        raise ConfigError("the calibration text has fewer than 2 tokens")
    bos, _ = scoring_bos(tokenizer, model_dir)
    prefix = [] if bos is None else [bos]
    stride = CONTEXT - len(prefix)
    for start in range(0, len(ids), stride):
        sequence_logits(model, prefix + ids[start:start + stride])
    return stats
