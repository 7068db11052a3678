"""Repacked weights, cached on disk under a key derived from the checkpoint's content.

The key hashes config.json, every safetensors header and size, and a sample of each file's
bytes (for a GGUF file's description, the file's content hash), plus the cache layout and the
backend variant (kernel layout version and ISA). It never contains a path, so a moved checkpoint
or cache directory still hits. Each cached layer is a safetensors file whose size and CRC-32 are
recorded in the entry's manifest and checked before the file is memory-mapped; a file that fails
the check is rebuilt from the checkpoint.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import zlib
from pathlib import Path

import torch
from safetensors import safe_open

from shrike.default_model import SOURCE_FILE, cache_dir, process_alive
from shrike.quantization.safetensors_io import CheckpointFiles, StreamingSafetensorsWriter, TensorSpec

CACHE_LAYOUT_VERSION = 1
_SAMPLES_PER_FILE = 32
_SAMPLE_BYTES = 1 << 16
MANIFEST = "manifest.json"


def repack_cache_root() -> Path:
    return cache_dir() / "repacked"


def checkpoint_identity(files: CheckpointFiles) -> str:
    """A content hash of a checkpoint that is cheap to compute for multi-gigabyte files."""
    digest = hashlib.sha256((files.model_dir / "config.json").read_bytes())
    source = files.model_dir / SOURCE_FILE  # a GGUF file's description holds no weights: the file's hash stands in
    if source.is_file():
        digest.update(source.read_bytes())
    for path in files.files:
        size = path.stat().st_size
        _, data_start = files.headers[path]
        with open(path, "rb") as f:
            digest.update(f"{path.name}:{size}".encode())
            digest.update(f.read(data_start))  # the header: names, dtypes, shapes and offsets
            data_size = size - data_start
            for i in range(_SAMPLES_PER_FILE):
                f.seek(data_start + data_size * i // _SAMPLES_PER_FILE)
                digest.update(f.read(_SAMPLE_BYTES))
    return digest.hexdigest()


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return crc


class RepackCache:
    """One cache entry: the repacked layers of one checkpoint for one backend variant."""

    def __init__(self, files: CheckpointFiles, variant: str, root: Path | None = None):
        key_source = f"{checkpoint_identity(files)}:layout{CACHE_LAYOUT_VERSION}:{variant}"
        self.key = hashlib.sha256(key_source.encode()).hexdigest()[:32]
        self.entry = (root or repack_cache_root()) / self.key
        manifest_path = self.entry / MANIFEST
        try:
            self.manifest: dict[str, dict] = json.loads(manifest_path.read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError):
            self.manifest = {}
        self.writable = True
        self.swept = False  # whether part-written files of dead writers were removed
        self.rebuilt: list[str] = []  # names whose cached file failed its check

    @property
    def is_warm(self) -> bool:
        return bool(self.manifest)

    def load(self, name: str) -> dict[str, torch.Tensor] | None:
        """The cached tensors of `name`, memory-mapped; None when absent or failing the size/CRC check."""
        record = self.manifest.get(name)
        if record is None:
            return None
        path = self.entry / record["file"]
        try:
            intact = path.stat().st_size == record["size"] and _crc32(path) == record["crc32"]
        except OSError:
            intact = False
        if not intact:
            if not self.rebuilt:
                print(f"shrike: repack cache {self.entry} has a damaged file ({record['file']}); "
                      "rebuilding what fails its checksum", file=sys.stderr)
            self.rebuilt.append(name)
            return None
        return _open(path)

    def store(self, name: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Write `name` to the cache and return its tensors memory-mapped from there (as given if unwritable)."""
        if not self.writable:
            return tensors
        file = f"{name}.safetensors"
        tmp = _temporary(self.entry / file)
        try:
            if not self.swept:
                self.entry.mkdir(parents=True, exist_ok=True)
                _remove_abandoned_temporaries(self.entry)
                self.swept = True
            writer = StreamingSafetensorsWriter(tmp, [TensorSpec(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()])
            for key, tensor in tensors.items():
                writer.write(key, tensor)
            writer.close()
            os.replace(tmp, self.entry / file)
            self.manifest[name] = {"file": file, "size": writer.size, "crc32": writer.crc32}
            _atomic_write(self.entry / MANIFEST, json.dumps({"files": self.manifest}, indent=0).encode())
        except OSError as e:
            # A full disk, a quota, a read-only cache: serve from the checkpoint anyway, with a warning.
            print(f"shrike: warning: cannot write the repack cache in {self.entry} ({e.strerror or e}); "
                  "repacked weights stay in memory and are rebuilt on the next start", file=sys.stderr)
            self.writable = False
            for part in (tmp, _temporary(self.entry / MANIFEST)):  # part-written: only taking space the disk lacks
                with contextlib.suppress(OSError):
                    part.unlink()
            return tensors
        # Serve from the file just written: its pages are shared with the page cache instead of
        # being a second, private copy.
        return _open(self.entry / file)


def _open(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _temporary(path: Path) -> Path:
    """Written first, then renamed over `path`: other processes see the old file or the new one, never a part."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _remove_abandoned_temporaries(entry: Path) -> None:
    """Delete part-written files of processes that died while writing (SIGKILL, power loss)."""
    for tmp in entry.glob(".*.tmp"):
        owner = tmp.name.rsplit(".", 2)[-2]
        if owner.isdigit() and not process_alive(int(owner)):
            tmp.unlink(missing_ok=True)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = _temporary(path)
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
