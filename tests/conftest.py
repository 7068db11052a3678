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
