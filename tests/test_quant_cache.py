"""Repacked weights are cached by content: a move still hits, a damaged entry is rebuilt, never used."""
import shutil

import pytest
import torch

from shrike.eval_ppl import sequence_logits
from shrike.model.loader import load_model
from shrike.quantization.repack_cache import MANIFEST, RepackCache, repack_cache_root
from shrike.quantization.safetensors_io import CheckpointFiles
from shrike.synth import synthesize

IDS = list(range(200, 232))


@pytest.fixture(scope="module")
def w4a8_tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("w4a8") / "tiny"
    synthesize(path, "tiny", "w4a8-g128", progress=False)
    return path


def _entry(model_dir) -> RepackCache:
    from shrike.quantization.backends import KernelCoreBackend
    return RepackCache(CheckpointFiles(model_dir), KernelCoreBackend().variant)


def test_cold_then_warm_then_moved(w4a8_tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(tmp_path / "cache"))
    assert not _entry(w4a8_tiny).is_warm
    cold = load_model(str(w4a8_tiny), progress=False)
    expected = sequence_logits(cold.model, IDS)
    entry = _entry(w4a8_tiny)
    assert entry.is_warm and len(entry.manifest) == 2 * 4  # 2 layers x (qkv, o, gate_up, down)

    moved_model = tmp_path / "elsewhere" / "renamed"
    shutil.copytree(w4a8_tiny, moved_model)
    (tmp_path / "cache").rename(tmp_path / "cache2")
    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(tmp_path / "cache2"))
    moved_entry = _entry(moved_model)
    assert moved_entry.is_warm and moved_entry.key == entry.key
    warm = load_model(str(moved_model), progress=False)
    assert torch.equal(sequence_logits(warm.model, IDS), expected)
    assert all(RepackCache.load(moved_entry, name) is not None for name in moved_entry.manifest)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_entry_is_detected_and_rebuilt(w4a8_tiny, tmp_path, monkeypatch, damage):
    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(tmp_path / "cache"))
    expected = sequence_logits(load_model(str(w4a8_tiny), progress=False).model, IDS)
    entry = _entry(w4a8_tiny)
    name = "model.layers.1.mlp.gate_proj"
    path = entry.entry / entry.manifest[name]["file"]
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x55
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 3]))
    else:
        path.unlink()
    assert entry.load(name) is None and entry.rebuilt == [name]

    reloaded = load_model(str(w4a8_tiny), progress=False)
    assert torch.equal(sequence_logits(reloaded.model, IDS), expected)
    repaired = _entry(w4a8_tiny)
    assert repaired.load(name) is not None and not repaired.rebuilt


def test_other_weights_with_the_same_shapes_get_a_new_key(w4a8_tiny, tmp_path):
    other = tmp_path / "other"
    synthesize(other, "tiny", "w4a8-g128", seed=1, progress=False)
    assert (other / "model.safetensors").stat().st_size == (w4a8_tiny / "model.safetensors").stat().st_size
    assert _entry(other).key != _entry(w4a8_tiny).key


def test_default_root_is_under_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(tmp_path))
    assert repack_cache_root() == tmp_path / "repacked"
    assert MANIFEST == "manifest.json"
