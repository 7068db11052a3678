"""`shrike convert` refuses what it cannot do in one line of its own words, never a traceback or numpy's."""
from __future__ import annotations

import subprocess
import sys

import pytest

from shrike.default_model import default_gguf_path


def _convert(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shrike.cli", "convert", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> dict:
    """The default model's GGUF cut short at a few places, and a file that is no GGUF at all."""
    directory = tmp_path_factory.mktemp("damaged")
    whole = default_gguf_path().read_bytes()[:40 << 20]
    files = {}
    for name, length in [("header", 100), ("vocabulary", 5 << 20), ("tensors", 40 << 20)]:
        files[name] = directory / f"cut-in-{name}.gguf"
        files[name].write_bytes(whole[:length])
    files["text"] = directory / "notes.gguf"
    files["text"].write_text("not a model\n")
    return files


@pytest.mark.parametrize("name", ["header", "vocabulary", "tensors"])
def test_a_truncated_gguf_is_named_as_such(damaged, name, tmp_path):
    result = _convert(damaged[name], tmp_path / "out")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"shrike convert: error: {damaged[name]} is not a complete GGUF file: it "
                                          "ends before the metadata and tensors it declares (an interrupted "
                                          "download or copy?); fetch the file again"]
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_no_gguf(damaged, tmp_path):
    result = _convert(damaged["text"], tmp_path / "out")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"shrike convert: error: {damaged['text']} is not a GGUF file (it does not "
                                          "start with the bytes GGUF)"]


@pytest.mark.parametrize("quantize", [[], ["--quantize", "w8a8"]], ids=["bf16", "w8a8"])
def test_an_output_that_is_a_file(damaged, tmp_path, quantize):
    existing = tmp_path / "existing"
    existing.write_text("keep me\n")
    result = _convert(damaged["tensors"], existing, *quantize)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"shrike convert: error: {existing} exists and is not a directory; give a "
                                          "directory to write the checkpoint into"]
    assert existing.read_text() == "keep me\n"


def test_an_output_below_a_file(damaged, tmp_path):
    (tmp_path / "file").write_text("")
    result = _convert(damaged["tensors"], tmp_path / "file" / "out")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"shrike convert: error: cannot write into {tmp_path / 'file'}; choose an "
                                          "output directory you may write to"]
