"""Embedding-model directories the embedding tests build from the default model: the same weights with a
sentence-transformers pipeline (modules.json, 1_Pooling/config.json, optionally Normalize) written beside them."""
from __future__ import annotations

import json
from pathlib import Path

ST_MODES = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token", "last": "pooling_mode_lasttoken",
            "max": "pooling_mode_max_tokens", "weightedmean": "pooling_mode_weightedmean_tokens",
            "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens"}


def sentence_transformers_dir(model_dir: Path, target: Path, mode: str, normalize: bool) -> Path:
    """`target` with links to model_dir's files and a sentence-transformers pipeline pooling by `mode`
    (several joined by "+" are concatenated, as sentence-transformers does)."""
    target.mkdir(parents=True)
    for item in model_dir.iterdir():
        (target / item.name).symlink_to(item)
    hidden = json.loads((model_dir / "config.json").read_text())["hidden_size"]
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (target / "2_Normalize").mkdir()
    (target / "modules.json").write_text(json.dumps(modules))
    (target / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": hidden, "include_prompt": True,
               **{key: name in mode.split("+") for name, key in ST_MODES.items()}}
    (target / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (target / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 2048, "do_lower_case": False}))
    return target
