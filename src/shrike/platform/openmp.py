"""The OpenMP wait policy Shrike sets for PyTorch (shrike/__init__.py), kept out of the programs it starts."""
from __future__ import annotations

import os

from shrike import USER_OMP_WAIT_POLICY


def peer_environment() -> dict[str, str]:
    """os.environ without the OpenMP wait policy Shrike set for itself: the environment another engine (llama.cpp,
    vLLM) started from a Shrike process should run in; ggml's OpenMP threads would sleep between its ops too."""
    env = dict(os.environ)
    if USER_OMP_WAIT_POLICY is None:
        env.pop("OMP_WAIT_POLICY", None)
    else:
        env["OMP_WAIT_POLICY"] = USER_OMP_WAIT_POLICY
    return env
