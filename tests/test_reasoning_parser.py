"""--reasoning-parser: splitting <think>...</think> whole and streamed, and grammars that start after it."""
from __future__ import annotations

import pytest
import torch

from shrike.sampling.grammar import GrammarSpec
from shrike.sampling.grammar_backends import new_grammar_compiler
from shrike.sampling.params import SamplingParams
from shrike.sampling.sampler import SamplingRow, sample
from shrike.server.reasoning import CLOSE, AfterReasoning, ReasoningParser, ReasoningStream
from shrike.tokenizer import Tokenizer
from test_grammar_backends import allowed_ids

OUTPUTS = {
    "<think>Let me think.\nHmm</think>\n\nThe answer is 4.": {"deepseek_r1": ("Let me think.\nHmm", "The answer is 4."),
                                                            "qwen3": ("Let me think.\nHmm", "The answer is 4.")},
    "Reasoning here</think>Answer": {"deepseek_r1": ("Reasoning here", "Answer"),
                                     "qwen3": (None, "Reasoning here</think>Answer")},
    "No thinking at all.": {"deepseek_r1": ("No thinking at all.", ""), "qwen3": (None, "No thinking at all.")},
    "<think>cut off by max_tokens": {"deepseek_r1": ("cut off by max_tokens", ""),
                                     "qwen3": ("cut off by max_tokens", "")},
}


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
@pytest.mark.parametrize("output", list(OUTPUTS))
@pytest.mark.parametrize("piece", [1, 2, 7])
def test_whole_and_streamed_splits_agree(name, output, piece):
    parser = ReasoningParser(name)
    assert parser.split(output) == OUTPUTS[output][name]
    stream = ReasoningStream(parser)
    parts = []
    for i in range(0, len(output), piece):
        parts += stream.push(output[i:i + piece])
    parts += stream.finish()
    reasoning = "".join(t for kind, t in parts if kind == "reasoning")
    content = "".join(t for kind, t in parts if kind == "content")
    assert ((reasoning if stream.had_reasoning else None), content) == OUTPUTS[output][name]
    assert CLOSE not in reasoning


def test_the_grammar_starts_after_the_reasoning(default_model_dir):
    tokenizer = Tokenizer(default_model_dir)
    vocab = 49152
    compiled = new_grammar_compiler("llguidance", tokenizer, vocab).compile(GrammarSpec("regex", "[0-9]{2}", "p"))
    grammar = AfterReasoning(compiled, tokenizer.encode(CLOSE, add_special_tokens=False))
    row = SamplingRow(SamplingParams(temperature=1.0, grammar=grammar), [0], [],
                      frozenset(tokenizer.eos_token_ids), None)
    generator = torch.Generator().manual_seed(0)
    for token in tokenizer.encode("I think twenty-one.</think>", add_special_tokens=False):
        assert allowed_ids(row.constraint.next_mask(), vocab).all()  # free while reasoning
        row.constraint.accept(token)
        row.output_ids.append(token)
    answer = []
    while True:
        token = int(sample(torch.randn(1, vocab, generator=generator) * 4, [row])[0][0])
        row.output_ids.append(token)
        if token in tokenizer.eos_token_ids:
            break
        answer.append(token)
    text = tokenizer.decode(answer)
    assert len(text) == 2 and text.isdigit(), text
