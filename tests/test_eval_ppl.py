"""`shrike eval-ppl`: chunking, the perplexity formula, and the command line."""
import math

import pytest
import torch

from shrike.cli import main
from shrike.eval_ppl import evaluate_perplexity, sequence_logits
from shrike.model.loader import load_model
from shrike.synth import synthesize

TEXT = "tests/data/public_domain_english.txt"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("ppl") / "tiny"
    synthesize(path, "tiny", "bf16", progress=False)
    return path


def test_chunks_score_all_but_their_first_token(tiny):
    model = load_model(str(tiny), progress=False).model
    ids = list(range(500, 570))  # 70 tokens: chunks of 32, 32 and 6
    result = evaluate_perplexity(model, ids, context=32)
    assert result.chunks == 3 and result.scored_tokens == 31 + 31 + 5 == len(result.greedy_predictions)
    nll = 0.0
    for start in (0, 32, 64):
        chunk = ids[start:start + 32]
        logp = torch.log_softmax(sequence_logits(model, chunk)[:-1], dim=-1)
        nll -= sum(logp[i, t].item() for i, t in enumerate(chunk[1:]))
    assert math.isclose(result.perplexity, math.exp(nll / 67), rel_tol=1e-4)


def test_command_prints_perplexity(tiny, capsys):
    assert main(["eval-ppl", str(tiny), TEXT, "--context", "256"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("perplexity ") and "non-overlapping chunks of up to 256" in out
    value = float(out.split()[1])
    assert 1000 < value < 200000  # a random model is near-uniform over 49,152 tokens


def test_command_reports_a_missing_file(tiny, capsys):
    assert main(["eval-ppl", str(tiny), "no/such/file.txt"]) == 2
    assert "is not a file" in capsys.readouterr().err
