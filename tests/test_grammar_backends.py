"""Both grammar backends on the default model's vocabulary, driven through the real sampler."""
from __future__ import annotations

import json
import re

import pytest
import torch

from shrike.sampling.grammar import GrammarError, GrammarSpec
from shrike.sampling.grammar_backends import new_grammar_compiler
from shrike.sampling.params import SamplingParams
from shrike.sampling.sampler import SamplingRow, sample
from shrike.tokenizer import Tokenizer

VOCAB = 49152  # SmolLM2's embedding rows
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2}},
          "required": ["name", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    return Tokenizer(default_model_dir)


@pytest.fixture(scope="module", params=["llguidance", "xgrammar"])
def compiler(request, tokenizer):
    return new_grammar_compiler(request.param, tokenizer, VOCAB)


def allowed_ids(mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(ceil(V/32),) int32 bitmask -> (vocab_size,) bool: token t is bit t % 32 of word t // 32; ids past the
    mask's words (a grammar vocabulary shorter than the model's) are not allowed, as in the sampler."""
    bits = ((mask[:, None] >> torch.arange(32, dtype=torch.int32)) & 1).reshape(-1).bool()
    return torch.cat([bits, torch.zeros(max(0, vocab_size - bits.numel()), dtype=torch.bool)])[:vocab_size]


def _allowed(row: SamplingRow) -> torch.Tensor:
    return allowed_ids(row.constraint.next_mask(), VOCAB)


@pytest.mark.parametrize("spec, text", [
    (GrammarSpec("json_schema", SCHEMA, "p"), '{"name": "Ann", "tags": ["x", "y"]}'),
    (GrammarSpec("json_object", None, "p"), '{"a": [1, {"b": null}]}'),
    (GrammarSpec("regex", r"\d{3}-[a-z]{3}", "p"), "123-abc"),
    (GrammarSpec("choice", ["red", "green blue"], "p"), "green blue"),
    (GrammarSpec("grammar", 'start: "n=" NUM\nNUM: /[0-9]+/', "p"), "n=42"),
    (GrammarSpec("grammar", 'root ::= "n=" [0-9]+', "p"), "n=42"),
], ids=["json_schema", "json_object", "regex", "choice", "lark", "ebnf"])
def test_valid_text_is_allowed_token_by_token_then_only_the_end(compiler, tokenizer, spec, text):
    eos = frozenset(tokenizer.eos_token_ids)
    row = SamplingRow(SamplingParams(grammar=compiler.compile(spec)), [0], [], eos, None)
    for token in tokenizer.encode(text, add_special_tokens=False):
        allowed = _allowed(row)
        assert allowed[token], tokenizer.decode([token])
        assert not allowed.all()
        row.constraint.accept(token)
        row.output_ids.append(token)
    if spec.kind in ("json_schema", "regex", "choice"):  # nothing can follow these texts but the end
        assert set(_allowed(row).nonzero()[:, 0].tolist()) <= eos


def test_sampling_at_temperature_one_stays_in_the_language(compiler, tokenizer):
    pattern = r"(yes|no|maybe) [0-9]{1,2}"
    grammar = compiler.compile(GrammarSpec("regex", pattern, "p"))
    eos = frozenset(tokenizer.eos_token_ids)
    generator = torch.Generator().manual_seed(0)
    rows = [SamplingRow(SamplingParams(temperature=1.0, grammar=grammar), [0], [], eos, None) for _ in range(6)]
    free = SamplingRow(SamplingParams(temperature=0), [0], [], eos, None)  # an unconstrained row in the batch
    done: list[list[int]] = []
    for _ in range(12):
        batch = rows + [free]
        logits = torch.randn(len(batch), VOCAB, generator=generator) * 4
        tokens, _ = sample(logits, batch)
        assert tokens[-1] == logits[-1].argmax()  # the unconstrained row is unaffected
        for row, token in zip(rows, tokens.tolist()):
            row.output_ids.append(token)
        done += [row.output_ids for row in rows if row.output_ids[-1] in eos]
        rows = [row for row in rows if row.output_ids[-1] not in eos]
        if not rows:
            break
    assert not rows and len(done) == 6
    texts = [tokenizer.decode(ids[:-1]) for ids in done]
    assert all(re.fullmatch(pattern, t) for t in texts), texts


@pytest.mark.parametrize("spec, words", [
    (GrammarSpec("json_schema", {"type": "strin"}, "response_format"), "strin"),
    (GrammarSpec("json_schema", {"not": {"type": "string"}}, "response_format"), "not"),
    (GrammarSpec("json_schema", {"$ref": "#/$defs/missing"}, "response_format"), "missing"),
    (GrammarSpec("regex", "(unclosed", "structured_outputs.regex"), ""),
    (GrammarSpec("grammar", "start: nowhere", "structured_outputs.grammar"), ""),
])
def test_invalid_or_unenforceable_grammars_are_refused_with_the_field(compiler, spec, words):
    with pytest.raises(GrammarError) as error:
        compiler.compile(spec)
    assert str(error.value).startswith(spec.param + ":") and words in str(error.value)


def test_compiled_grammars_are_cached_by_content(compiler):
    a = compiler.compile(GrammarSpec("json_schema", json.loads(json.dumps(SCHEMA)), "x"))
    assert compiler.compile(GrammarSpec("json_schema", SCHEMA, "y")) is a
