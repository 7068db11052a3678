"""Convert a GGUF file (llama, gemma3 or qwen3moe architecture) into a Hugging Face-style model directory.

Every tensor type the `gguf` package dequantizes converts (F32, F16, BF16, Q4_0 .. Q8_0, the
K-quants Q2_K .. Q6_K, IQ4_NL/IQ4_XS and the other i-quants); the weights are written as bf16, or not at
all for a file run from its own blocks (the directory then only describes the model).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import save_file
from tqdm import tqdm

from shrike.convert.gguf_metadata import GGUFMetadata
from shrike.convert.gguf_reader import FastGGUFReader
from shrike.convert.gemma3_gguf import Gemma3Tensors, gemma3_config
from shrike.convert.gguf_tokenizer import tokenizer_config, tokenizer_json
from shrike.convert.llama_config import generation_config, llama_config
from shrike.convert.llama_weights import TensorConverter
from shrike.convert.moe_gguf import MoeTensors, is_moe, mixtral_config, qwen3moe_config

# Part of every cache key: bump it whenever the files convert_gguf writes would change for the same input
CONVERTER_VERSION = 2

# general.architecture -> (config.json builder, tensor converter)
ARCHITECTURES = {
    "llama": (llama_config, TensorConverter),
    "gemma3": (gemma3_config, Gemma3Tensors),
    "qwen3moe": (qwen3moe_config, MoeTensors),
}
MIXTRAL = (mixtral_config, MoeTensors)  # a llama file with experts


def check_architecture(meta: GGUFMetadata) -> None:
    if meta.architecture not in ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {meta.architecture!r} is not supported; Shrike converts 'llama' (Llama, Mistral, "
            "SmolLM, Mixtral and others llama.cpp stores as 'llama'), 'gemma3' (Gemma 3 text models) and "
            "'qwen3moe' (Qwen3-MoE)"
        )


@dataclass
class GGUFModel:
    """A GGUF file read as a Hugging Face-style model: its config.json, and how its tensors convert. Reading the
    metadata of a large vocabulary takes seconds: one load reads it once."""
    path: Path
    reader: FastGGUFReader
    meta: GGUFMetadata
    config: dict  # config.json
    converter: TensorConverter


def read_gguf_model(src: Path) -> GGUFModel:
    reader = open_gguf(src)
    meta = GGUFMetadata(reader)
    check_architecture(meta)
    tensor_names = {tensor.name for tensor in reader.tensors}
    if "token_embd.weight" not in tensor_names:
        raise ValueError(f"{src} has no token_embd.weight tensor, so it is not a usable language model")
    embedding = next(tensor for tensor in reader.tensors if tensor.name == "token_embd.weight")
    vocab_size = int(embedding.shape[1])  # GGUF shape is [hidden, vocab]
    build_config, converter = MIXTRAL if meta.architecture == "llama" and is_moe(meta) \
        else ARCHITECTURES[meta.architecture]
    config = build_config(meta, vocab_size=vocab_size, has_output_weight="output.weight" in tensor_names)
    return GGUFModel(Path(src), reader, meta, config, converter(config))


def convert_gguf(src: Path, dst: Path, progress: bool = True, weights: bool = True) -> None:
    """Write config.json, the tokenizer files, generation_config.json and, with weights, model.safetensors (bf16)
    into dst. Without weights the directory describes the model and model.weights.GGUFTensors reads its
    tensors from the file itself."""
    src, dst = Path(src), Path(dst)
    check_output_dir(dst)
    model = read_gguf_model(src)
    tokenizer_text = tokenizer_json(model.meta)
    tokenizer_settings = tokenizer_config(model.meta, tokenizer_text,
                                          model_max_length=model.config["max_position_embeddings"])
    if weights:
        tensors = tqdm(model.reader.tensors, desc=f"Converting {src.name}", unit="tensor", disable=not progress)
        converted = model.converter.convert_all(tensors)
    try:
        dst.mkdir(parents=True, exist_ok=True)
        if weights:
            save_file(converted, dst / "model.safetensors", metadata={"format": "pt"})
        (dst / "tokenizer.json").write_text(tokenizer_text, encoding="utf-8")
        _write_json(dst / "config.json", model.config)
        _write_json(dst / "generation_config.json", generation_config(model.meta))
        _write_json(dst / "tokenizer_config.json", tokenizer_settings)
    except OSError as error:
        raise ValueError(f"cannot write the checkpoint into {dst}: {error.strerror or error}") from None


def check_output_dir(dst: Path) -> None:
    """Before the conversion's minutes of work: the output must be a directory we may create or write into."""
    if dst.exists() and not dst.is_dir():
        raise ValueError(f"{dst} exists and is not a directory; give a directory to write the checkpoint into")
    existing = next(path for path in (dst, *dst.absolute().parents) if path.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write into {existing}; choose an output directory you may write to")


def open_gguf(src: Path) -> FastGGUFReader:
    """The GGUF reader, or a ValueError saying in our words why the file cannot be read."""
    try:
        return FastGGUFReader(src)
    except OSError as error:
        raise ValueError(f"cannot read {src}: {error.strerror or error}") from None
    except (ValueError, IndexError, KeyError, TypeError):
        # gguf and numpy word these by their own internals (a reshape, a dtype view): say what it means
        with open(src, "rb") as file:
            magic = file.read(4)
        if magic != b"GGUF":
            raise ValueError(f"{src} is not a GGUF file (it does not start with the bytes GGUF)") from None
        raise ValueError(f"{src} is not a complete GGUF file: it ends before the metadata and tensors it declares "
                         "(an interrupted download or copy?); fetch the file again") from None


def _write_json(path: Path, document: dict) -> None:
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
