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
from shrike.layers.lm_head import Int8LMHead, int8_lm_head, quantize_rows_int8
from shrike.model.loader import load_model

TEXTS = ["tests/data/public_domain_english.txt", "tests/data/calibration_bill_of_rights.txt"]
MAX_PERPLEXITY_INCREASE = 0.02
MIN_GREEDY_AGREEMENT = 0.93
CONTEXT = 512


@pytest.fixture(scope="module")
def loaded(default_model_dir):
    return load_model(str(default_model_dir), progress=False)


class RecordingHead:
    """Stands in for the model's compute_logits to keep the final hidden states, so both heads score one
    forward pass."""

    def __init__(self, compute_logits):
        self.compute_logits, self.hidden = compute_logits, []

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        self.hidden.append(hidden.clone())
        return self.compute_logits(hidden)


def score(logits: torch.Tensor, targets: torch.Tensor) -> tuple[float, torch.Tensor]:
    return float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum")), logits.argmax(dim=-1)


@pytest.mark.parametrize("text", TEXTS)
def test_int8_head_stays_within_the_measured_perplexity_and_agreement_bounds(loaded, text):
    model = loaded.model
    int8_head = int8_lm_head(model.lm_head, loaded.model_dir, "auto")
    ids = loaded.tokenizer.encode(open(text, encoding="utf-8").read(), add_special_tokens=False)
    nll = {"bf16": 0.0, "int8": 0.0}
    agree = scored = 0
    try:
        for start in range(0, len(ids) - 1, CONTEXT):
            chunk = ids[start:start + CONTEXT]
            if len(chunk) < 2:
                break
            model.compute_logits = recorder = RecordingHead(type(model).compute_logits.__get__(model))
            with torch.inference_mode():
                logits = sequence_logits(model, chunk)[:-1]
                targets = torch.tensor(chunk[1:])
                nll_bf16, greedy_bf16 = score(logits, targets)
                nll_int8, greedy_int8 = score(int8_head(recorder.hidden[0])[:-1], targets)
            nll["bf16"] += nll_bf16
            nll["int8"] += nll_int8
            agree += int((greedy_bf16 == greedy_int8).sum())
            scored += len(targets)
    finally:
        model.__dict__.pop("compute_logits", None)
    ppl = {name: torch.tensor(value / scored).exp().item() for name, value in nll.items()}
    increase = ppl["int8"] / ppl["bf16"] - 1
    assert scored > 500
    assert 0 < ppl["bf16"] < 100  # the real model on English text
    assert abs(increase) <= MAX_PERPLEXITY_INCREASE, ppl
    assert agree / scored >= MIN_GREEDY_AGREEMENT, f"agreement {agree / scored:.4f}"


def test_int8_head_comes_from_the_repack_cache_and_matches_its_reference(loaded):
    weight = loaded.model.embed_tokens  # (vocab, hidden) bf16; the lm_head is tied to it (AMX tiles on amx)
    first = int8_lm_head(loaded.model.lm_head, loaded.model_dir, "auto")
    again = int8_lm_head(weight, loaded.model_dir, "auto")  # served from the cache entry written by `first`
    assert torch.equal(first.weight.packed, again.weight.packed)
    values, scale = quantize_rows_int8(weight)
    assert torch.equal(first.weight.unpack()[0], values) and torch.equal(first.weight.unpack()[1].flatten(), scale)
    assert (values.abs().amax(dim=1) == 127).all()  # per row, absmax maps to 127
    reference = int8_lm_head(weight, loaded.model_dir, "reference")
    hidden = torch.randn(3, weight.shape[1]).bfloat16()
    assert torch.equal(first(hidden), reference(hidden))  # the W8A8 kernels equal their reference bit for bit
    assert isinstance(first, Int8LMHead) and first(hidden).dtype == torch.float32


def test_the_flag_loads_an_int8_head_and_rejects_unknown_values(default_model_dir):
    model = load_model(str(default_model_dir), progress=False, lm_head_quant="int8").model
    assert isinstance(model.lm_head_int8, Int8LMHead)
    with pytest.raises(ConfigError, match="--lm-head-quant 'int4' is not known; use none or int8"):
        load_model(str(default_model_dir), progress=False, lm_head_quant="int4")
