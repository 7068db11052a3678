"""Convert a llama-architecture GGUF file into a Hugging Face-style model directory."""

from __future__ import annotations

import json
from pathlib import Path

from gguf import GGUFReader
from safetensors.torch import save_file
from tqdm import tqdm

from shrike.convert.gguf_metadata import GGUFMetadata
from shrike.convert.gguf_tokenizer import tokenizer_config, tokenizer_json
from shrike.convert.llama_config import check_architecture, generation_config, llama_config
from shrike.convert.llama_weights import convert_tensors

# Part of every cache key: bump it whenever the files convert_gguf writes would change for the same input
CONVERTER_VERSION = 1


def convert_gguf(src: Path, dst: Path, progress: bool = True) -> None:
    """Write config.json, model.safetensors (bf16), tokenizer files and generation_config.json into dst."""
    src, dst = Path(src), Path(dst)
    try:
        reader = GGUFReader(src)
    except (ValueError, OSError) as error:
        raise ValueError(f"{src} is not a readable GGUF file: {error}") from error
    meta = GGUFMetadata(reader)
    check_architecture(meta)

    tensor_names = {tensor.name for tensor in reader.tensors}
    if "token_embd.weight" not in tensor_names:
        raise ValueError(f"{src} has no token_embd.weight tensor, so it is not a usable Llama model")
    embedding = next(tensor for tensor in reader.tensors if tensor.name == "token_embd.weight")
    vocab_size = int(embedding.shape[1])  # GGUF shape is [hidden, vocab]
    config = llama_config(meta, vocab_size=vocab_size, has_output_weight="output.weight" in tensor_names)

    tokenizer_text = tokenizer_json(meta)
    tokenizer_settings = tokenizer_config(meta, tokenizer_text, model_max_length=config["max_position_embeddings"])

    tensors = tqdm(reader.tensors, desc=f"Converting {src.name}", unit="tensor", disable=not progress)
    weights = convert_tensors(tensors, config)

    dst.mkdir(parents=True, exist_ok=True)
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    (dst / "tokenizer.json").write_text(tokenizer_text, encoding="utf-8")
    _write_json(dst / "config.json", config)
    _write_json(dst / "generation_config.json", generation_config(meta))
    _write_json(dst / "tokenizer_config.json", tokenizer_settings)


def _write_json(path: Path, document: dict) -> None:
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
