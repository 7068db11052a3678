"""SentencePiece vocabularies in GGUF (llama.cpp's tokenizer model 'llama') on tiny hand-made files:
merge priority by score, byte fallback, the leading-space flag, and agreement with transformers'
own GGUF tokenizer on the same file. Gemma 3's 262k vocabulary is checked against llama.cpp in
test_gemma3.py."""
from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import transformers
from tokenizers import Tokenizer as FastTokenizer

from shrike.convert.gguf_metadata import GGUFMetadata
from shrike.convert.gguf_reader import FastGGUFReader
from shrike.convert.gguf_tokenizer import tokenizer_json

S = "\u2581"
SPECIALS = ["<unk>", "<s>", "</s>"]
BYTES = [f"<0x{b:02X}>" for b in range(256)]
# (piece, score): "bc" outranks "ab", so "abc" splits a|bc although "ab" comes first in the text
PIECES = [(S, -1.0), ("a", -2.0), ("b", -3.0), ("c", -4.0), ("bc", -5.0), ("ab", -6.0), (S + "a", -7.0),
          (S + "ab", -8.0), ("é", -9.0)]
ID = {piece: len(SPECIALS) + len(BYTES) + i for i, (piece, _) in enumerate(PIECES)}


def write_vocab(path: Path, space_prefix: bool | None) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(SPECIALS + BYTES + [piece for piece, _ in PIECES])
    writer.add_token_scores([0.0] * (len(SPECIALS) + len(BYTES)) + [score for _, score in PIECES])
    writer.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                           + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(PIECES))
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    if space_prefix is not None:
        writer.add_add_space_prefix(space_prefix)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tokenizer_of(path: Path) -> FastTokenizer:
    return FastTokenizer.from_str(tokenizer_json(GGUFMetadata(FastGGUFReader(path))))


@pytest.fixture(scope="module")
def llama_style(tmp_path_factory) -> Path:
    return write_vocab(tmp_path_factory.mktemp("spm") / "llama-style.gguf", space_prefix=None)


def test_merges_follow_piece_scores_and_bytes_fill_the_gaps(llama_style):
    tokenizer = tokenizer_of(llama_style)
    # llama.cpp's default for SentencePiece files is a leading space: "abc" is "▁abc"
    assert tokenizer.encode("abc").ids == [1, ID[S + "a"], ID["bc"]]
    assert tokenizer.encode("ab ab").ids == [1, ID[S + "ab"], ID[S + "ab"]]
    # "ü" is no piece: its UTF-8 bytes C3 BC; "é" is one
    assert tokenizer.encode("éü", add_special_tokens=False).ids == [ID[S], ID["é"], 3 + 0xC3, 3 + 0xBC]
    assert tokenizer.decode(tokenizer.encode("ab abc éü").ids) == "ab abc éü"


def test_without_space_prefix_text_starts_as_written(tmp_path):
    tokenizer = tokenizer_of(write_vocab(tmp_path / "gemma-style.gguf", space_prefix=False))
    assert tokenizer.encode("abc").ids == [1, ID["a"], ID["bc"]]
    assert tokenizer.encode(" a").ids == [1, ID[S + "a"]]
    assert tokenizer.decode(tokenizer.encode(" a bc").ids) == " a bc"


def test_agrees_with_transformers_reading_the_same_gguf(llama_style):
    reference = transformers.AutoTokenizer.from_pretrained(llama_style.parent, gguf_file=llama_style.name)
    ours = tokenizer_of(llama_style)
    for text in ("abc", "ab ab", "a  b", "cab bca", "éü c", "bcbcab"):
        assert ours.encode(text).ids == reference.encode(text), text


def test_other_tokenizer_models_are_refused_in_one_line(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "bert.gguf"), "llama")
    writer.add_tokenizer_model("bert")
    writer.add_token_list(["[UNK]"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"^GGUF tokenizer model 'bert' is not supported; supported: 'gpt2' "
                                         r"\(byte-level BPE\) and 'llama' \(SentencePiece with byte fallback\)$"):
        tokenizer_of(tmp_path / "bert.gguf")
