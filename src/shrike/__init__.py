"""Shrike: a CPU-native LLM serving engine.

`from shrike import LLM, SamplingParams` for offline generation; LLM (which pulls in torch) loads on first use.
"""

__version__ = "0.1.0"

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
