"""Embeddings on the engine (LLM.embed): the pooling a sentence-transformers checkpoint declares equals
sentence-transformers' own encode on the same weights; a decoder model without one is pooled from its last
token and normalized, as vLLM does; a batch cut into chunks equals each input alone; misuse is one line."""
from __future__ import annotations

import shutil

import pytest
import torch
import transformers

from embedding_models import sentence_transformers_dir
from shrike import LLM, PoolingParams, SamplingParams
from shrike.errors import ConfigError

TEXTS = ["Hello world",
         "The capital of France is Paris, and the capital of Italy is Rome; both are old cities on rivers.",
         "Embeddings turn text into vectors.\nSearch compares them by cosine similarity. " * 3,
         "x"]
# A small step budget cuts the longer texts into chunks, some shared with other texts in one step.
ENGINE = dict(max_model_len=512, kv_cache_space=0.05, progress=False, dtype="float32", max_num_batched_tokens=16)


def _close(a: list[float], b: torch.Tensor, tolerance: float) -> None:
    a = torch.tensor(a)
    scale = float(b.abs().max())
    assert a.shape == b.shape and float((a - b).abs().max()) <= tolerance * scale, float((a - b).abs().max()) / scale


# (Last-token pooling, vLLM's default for decoders, is checked against transformers in the next test.)
@pytest.mark.parametrize("mode, normalize", [("mean+max", True), ("cls", False), ("weightedmean+mean_sqrt_len", False)])
def test_sentence_transformers_pooling_equals_its_encode(default_model_dir, tmp_path, mode, normalize):
    from sentence_transformers import SentenceTransformer

    model_dir = sentence_transformers_dir(default_model_dir, tmp_path / "st", mode, normalize)
    reference = SentenceTransformer(str(model_dir), device="cpu", model_kwargs={"dtype": torch.float32})
    llm = LLM(str(model_dir), **ENGINE)  # runner auto: a modules.json makes it an embedding model
    assert llm.llm_engine.runner_kind == "pooling"
    outputs = llm.embed(TEXTS)
    for text, output in zip(TEXTS, outputs):
        assert output.prompt_token_ids == reference.tokenize([text])["input_ids"][0].tolist()
        expected = reference.encode([text], convert_to_tensor=True)[0].float()  # one at a time: no padding
        _close(output.outputs.embedding, expected, 2e-5)
        alone = llm.embed(text)[0].outputs.embedding
        _close(output.outputs.embedding, torch.tensor(alone), 1e-6)  # batched and chunked == alone


def test_a_decoder_without_pooling_config_is_pooled_from_its_last_token(default_model_dir, tmp_path):
    """A tiny random Qwen3 (another architecture, q/k norms) and --task embed: vLLM's default pooling."""
    torch.manual_seed(0)
    config = transformers.Qwen3Config(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                      max_position_embeddings=512)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    model.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir / name, tmp_path / name)
    llm = LLM(str(tmp_path), task="embed", **ENGINE)
    prompts = [[1, 5, 9, 200, 4000], list(range(100, 140))]
    vectors = [o.outputs.embedding for o in llm.embed(prompts)]
    with torch.no_grad():
        for prompt, vector in zip(prompts, vectors):
            hidden = model.model(torch.tensor([prompt])).last_hidden_state[0, -1]
            _close(vector, hidden / hidden.norm(), 1e-5)
    # Last-token pooling is exact with a cached prefix: the prompt's blocks are reused, the vector is the same.
    again = llm.embed(prompts)
    assert llm.llm_engine.block_manager.prefix_hits > 0
    for a, b in zip(again, vectors):
        _close(a.outputs.embedding, torch.tensor(b), 1e-6)


def test_misuse_is_one_line(default_model_dir, tmp_path):
    generator = LLM(str(default_model_dir), **ENGINE)
    with pytest.raises(ValueError, match="--runner pooling"):
        generator.embed("Hello")
    embedder = LLM(str(default_model_dir), runner="pooling", **ENGINE)
    with pytest.raises(ValueError, match="generates no text"):
        embedder.generate("Hello", SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="not a Matryoshka model"):
        embedder.embed("Hello", PoolingParams(dimensions=64))
    assert len(embedder.embed("Hello", PoolingParams(dimensions=576))[0].outputs.embedding) == 576
    with pytest.raises(ValueError, match="dimensions must be a whole number"):
        PoolingParams(dimensions=0)
    with pytest.raises(ValueError, match="the prompt has 513 tokens"):
        embedder.embed([[7] * 513])
    long = list(range(1000, 1600))
    assert embedder.embed([long], truncate_prompt_tokens=-1)[0].prompt_token_ids == long[-512:]
    with pytest.raises(ConfigError, match="--runner generate and --task embed disagree"):
        LLM(str(default_model_dir), runner="generate", task="embed", **ENGINE)
    bad = sentence_transformers_dir(default_model_dir, tmp_path / "dense", "mean", False)
    modules = (bad / "modules.json").read_text().replace("]", ', {"idx": 2, "name": "2", "path": "2_Dense", '
                                                              '"type": "sentence_transformers.models.Dense"}]')
    (bad / "modules.json").write_text(modules)
    with pytest.raises(ConfigError, match="'sentence_transformers.models.Dense' module"):
        LLM(str(bad), **ENGINE)


def test_matryoshka_dimensions_keep_the_leading_ones_then_normalize(default_model_dir, tmp_path):
    import json

    model_dir = tmp_path / "matryoshka"
    model_dir.mkdir()
    for item in default_model_dir.iterdir():
        if item.name != "config.json":
            (model_dir / item.name).symlink_to(item)
    config = json.loads((default_model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "is_matryoshka": True}))
    llm = LLM(str(model_dir), runner="pooling", **ENGINE)
    full = torch.tensor(llm.embed("Hello world")[0].outputs.embedding)
    short = torch.tensor(llm.embed("Hello world", PoolingParams(dimensions=32))[0].outputs.embedding)
    _close(short.tolist(), full[:32] / full[:32].norm(), 1e-6)
    with pytest.raises(ValueError, match="dimensions must be at most 576"):
        llm.embed("Hello", PoolingParams(dimensions=577))

