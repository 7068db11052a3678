"""--lm-head-quant int8 on the default model (SmolLM2-135M, bf16): its cost in perplexity and in
greedy (argmax) agreement with the bf16 head on both perplexity texts, and its repack-cache entry.

Measured on this build (both texts in full, chunks of 512 tokens, `shrike eval-ppl` numbers):
public_domain_english 18.073 -> 18.188 (+0.64%), argmax agreement 95.9%;
calibration_bill_of_rights 5.472 -> 5.511 (+0.71%), agreement 98.5%.
The bounds below leave about 3x margin on the perplexity increase and 2.5 points on agreement.
"""
from __future__ import annotations

import pytest
import torch

from shrike.errors import ConfigError
from shrike.eval_ppl import sequence_logits
from shrike.executor.step import EagerStep
from shrike.layers.lm_head import LMHead, int8_lm_head, quantize_rows_int8
from shrike.model.loader import load_model
from shrike.ops import builtin_op_table
from shrike.plugins import build_registry

TEXTS = ["tests/data/public_domain_english.txt", "tests/data/calibration_bill_of_rights.txt"]
MAX_PERPLEXITY_INCREASE = 0.02
MIN_GREEDY_AGREEMENT = 0.93
CONTEXT = 512


@pytest.fixture(scope="module")
def loaded(default_model_dir):
    return load_model(str(default_model_dir), progress=False)


class RecordingHead:
    """Stands in for the model's lm_head to keep the final hidden states, so both heads score one forward pass."""

    def __init__(self, head: LMHead):
        self.head, self.hidden = head, []

    def __call__(self, step, hidden: torch.Tensor) -> torch.Tensor:
        self.hidden.append(hidden.clone())
        return self.head(step, hidden)


def logits_of(head: LMHead, hidden: torch.Tensor, ops=None) -> torch.Tensor:
    """hidden (L, hidden) -> (L, vocab) float32 through `head` on the op table `ops` (default: built-in kernels)."""
    rows = hidden.shape[0]
    return head(EagerStep.prefill(ops or builtin_op_table(), torch.zeros(rows, dtype=torch.int64), 16,
                                  torch.arange(rows)), hidden)


def score(logits: torch.Tensor, targets: torch.Tensor) -> tuple[float, torch.Tensor]:
    return float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum")), logits.argmax(dim=-1)


@pytest.mark.parametrize("text", TEXTS)
def test_int8_head_stays_within_the_measured_perplexity_and_agreement_bounds(loaded, text):
    model = loaded.model
    bf16_head = model.lm_head
    int8_head = int8_lm_head(bf16_head, loaded.model_dir, "auto")
    ids = loaded.tokenizer.encode(open(text, encoding="utf-8").read(), add_special_tokens=False)
    nll = {"bf16": 0.0, "int8": 0.0}
    agree = scored = 0
    try:
        for start in range(0, len(ids) - 1, CONTEXT):
            chunk = ids[start:start + CONTEXT]
            if len(chunk) < 2:
                break
            model.lm_head = recorder = RecordingHead(bf16_head)
            with torch.inference_mode():
                logits = sequence_logits(model, chunk)[:-1]
                targets = torch.tensor(chunk[1:])
                nll_bf16, greedy_bf16 = score(logits, targets)
                nll_int8, greedy_int8 = score(logits_of(int8_head, recorder.hidden[0])[:-1], targets)
            nll["bf16"] += nll_bf16
            nll["int8"] += nll_int8
            agree += int((greedy_bf16 == greedy_int8).sum())
            scored += len(targets)
    finally:
        model.lm_head = bf16_head
    ppl = {name: torch.tensor(value / scored).exp().item() for name, value in nll.items()}
    increase = ppl["int8"] / ppl["bf16"] - 1
    assert scored > 500
    assert 0 < ppl["bf16"] < 100  # the real model on English text
    assert abs(increase) <= MAX_PERPLEXITY_INCREASE, ppl
    assert agree / scored >= MIN_GREEDY_AGREEMENT, f"agreement {agree / scored:.4f}"


def test_int8_head_comes_from_the_repack_cache_and_matches_its_reference(loaded):
    weight = loaded.model.embed_tokens  # (vocab, hidden) bf16; the lm_head is tied to it (AMX tiles on amx)
    first = int8_lm_head(loaded.model.lm_head, loaded.model_dir, "auto")
    again = int8_lm_head(LMHead(weight, weight.shape[0]), loaded.model_dir, "auto")  # from the entry `first` wrote
    assert torch.equal(first.weight.packed, again.weight.packed)
    values, scale = quantize_rows_int8(weight)
    assert torch.equal(first.weight.unpack()[0], values) and torch.equal(first.weight.unpack()[1].flatten(), scale)
    assert (values.abs().amax(dim=1) == 127).all()  # per row, absmax maps to 127
    reference = int8_lm_head(LMHead(weight, weight.shape[0]), loaded.model_dir, "reference")
    hidden = torch.randn(3, weight.shape[1]).bfloat16()
    reference_ops = build_registry(environ={"SHRIKE_PLUGINS": ""}).op_table("reference")
    # the W8A8 kernels equal their reference bit for bit
    assert torch.equal(logits_of(first, hidden), logits_of(reference, hidden, reference_ops))
    assert first.op_name == "w8a8_linear" and logits_of(first, hidden).dtype == torch.float32


def test_the_flag_loads_an_int8_head_and_rejects_unknown_values(default_model_dir):
    model = load_model(str(default_model_dir), progress=False, lm_head_quant="int8").model
    assert model.lm_head.op_name == "w8a8_linear" and model.lm_head.weight.n == model.config.vocab_size
    with pytest.raises(ConfigError, match="--lm-head-quant 'int4' is not known; use none or int8"):
        load_model(str(default_model_dir), progress=False, lm_head_quant="int4")
