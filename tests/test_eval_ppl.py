"""`shrike eval-ppl`: chunking, the perplexity formula, and the command line."""
import math
from pathlib import Path

import pytest
import torch

from shrike.cli import main
from shrike.eval_ppl import evaluate_perplexity, evaluate_perplexity_llama_cpp_windows, sequence_logits
from shrike.errors import ConfigError
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


def test_llama_cpp_windows_score_the_second_half_of_whole_chunks_led_by_bos(tiny):
    model = load_model(str(tiny), progress=False).model
    ids, bos = list(range(500, 570)), 1  # BOS + 70 tokens: two whole chunks of 32, the last 7 tokens unused
    result = evaluate_perplexity_llama_cpp_windows(model, ids, context=32, bos_token_id=bos)
    assert result.chunks == 2 and result.scored_tokens == 2 * 15 == len(result.greedy_predictions)
    nll, stream = 0.0, [bos] + ids
    for start in (0, 32):
        chunk = [bos] + stream[start + 1:start + 32]
        logp = torch.log_softmax(sequence_logits(model, chunk)[16:-1], dim=-1)
        nll -= sum(logp[i, t].item() for i, t in enumerate(chunk[17:]))
    assert math.isclose(result.perplexity, math.exp(nll / 30), rel_tol=1e-4)
    with pytest.raises(ConfigError, match="at least 2 x --context"):
        evaluate_perplexity_llama_cpp_windows(model, ids[:40], context=32)


def test_command_prints_perplexity(tiny, capsys):
    assert main(["eval-ppl", str(tiny), TEXT, "--context", "256"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("perplexity ") and "non-overlapping chunks of up to 256" in out
    value = float(out.split()[1])
    assert 1000 < value < 200000  # a random model is near-uniform over 49,152 tokens


def test_command_reports_a_missing_file(tiny, capsys):
    assert main(["eval-ppl", str(tiny), "no/such/file.txt"]) == 2
    assert "is not a file" in capsys.readouterr().err


def test_chunks_with_bos_score_every_text_token(tiny):
    model = load_model(str(tiny), progress=False).model
    ids = list(range(500, 570))  # 70 text tokens: chunks of BOS + 31, BOS + 31, BOS + 8
    result = evaluate_perplexity(model, ids, context=32, bos_token_id=1)
    assert result.chunks == 3 and result.scored_tokens == 70
    nll = 0.0
    for start in (0, 31, 62):
        chunk = [1] + ids[start:start + 31]
        logp = torch.log_softmax(sequence_logits(model, chunk)[:-1], dim=-1)
        nll -= sum(logp[i, t].item() for i, t in enumerate(chunk[1:]))
    assert math.isclose(result.perplexity, math.exp(nll / 70), rel_tol=1e-4)


def test_smollm2_scores_without_bos_and_says_so(capsys):
    assert main(["eval-ppl", "tests/data/calibration_bill_of_rights.txt"]) == 0
    out = capsys.readouterr().out
    assert "no BOS" in out and "add_bos_token is false" in out and "607 scored tokens" in out


def test_gguf_weights_flag_picks_the_native_or_converted_linears(capsys):
    scores = {}
    for weights in ("native", "bf16"):
        assert main(["eval-ppl", "tests/data/calibration_bill_of_rights.txt", "--gguf-weights", weights,
                     "--context", "128"]) == 0
        scores[weights] = capsys.readouterr().out.split()[1]
    assert scores["native"] != scores["bf16"]  # int8 activation blocks against 16-bit activations


def test_gemma3_is_scored_from_bos_as_transformers_scores_it(gemma3_model_dir, tmp_path, capsys):
    """Gemma 3's tokenizer config asks for BOS; without it the same text scores about twice as badly."""
    import transformers
    text = Path(TEXT).read_text()[:700]
    (tmp_path / "text.txt").write_text(text)
    assert main(["eval-ppl", str(gemma3_model_dir), str(tmp_path / "text.txt"), "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "each chunk starts with BOS '<bos>' (tokenizer_config.json add_bos_token is true)" in out
    ours = float(out.split()[1])

    tokenizer = transformers.AutoTokenizer.from_pretrained(gemma3_model_dir)
    ids = tokenizer(text, return_tensors="pt").input_ids  # (1, T), BOS first
    assert ids[0, 0].item() == tokenizer.bos_token_id
    hf = transformers.AutoModelForCausalLM.from_pretrained(gemma3_model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        reference = math.exp(hf(ids, labels=ids).loss.item())
    assert math.isclose(ours, reference, rel_tol=2e-3), (ours, reference)
    loaded = load_model(str(gemma3_model_dir), "float32", progress=False)
    without_bos = evaluate_perplexity(loaded.model, loaded.tokenizer.encode(text, add_special_tokens=False), 512)
    assert without_bos.perplexity > 1.3 * ours
