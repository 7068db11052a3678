"""Shrike: a CPU-native LLM serving engine.

`from shrike import LLM, SamplingParams` for offline generation; LLM (which pulls in torch) loads on first use.
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"

# PyTorch's OpenMP workers spin after each of its parallel regions, on the cores the kernel core's own pool
# needs next: on 2 cores SmolLM2 decoded at half the speed it does with them asleep. libgomp reads the policy
# once, when torch loads it; where they spin anyway (torch imported first, or the policy set otherwise),
# platform/binding.py gives torch one thread.
USER_OMP_WAIT_POLICY = _os.environ.get("OMP_WAIT_POLICY")  # what other programs started from here should see
if "torch" not in _sys.modules:
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
OPENMP_WORKERS_SPIN = _os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE"

__all__ = ["LLM", "SamplingParams", "PoolingParams", "LoRARequest", "RequestOutput", "CompletionOutput", "Logprob"]

_LAZY = {"LLM": "shrike.llm", "SamplingParams": "shrike.sampling.params", "PoolingParams": "shrike.engine.pooling",
         "LoRARequest": "shrike.engine.lora",
         "RequestOutput": "shrike.outputs",
         "CompletionOutput": "shrike.outputs", "Logprob": "shrike.outputs"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shrike' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *__all__])
