"""From a model argument to a ready model: resolve the directory, read config, load weights."""
from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from shrike.convert.gguf import read_gguf_model
from shrike.default_model import gguf_source, resolve_model
from shrike.errors import ConfigError
from shrike.layers.kv_dtypes import kv_cache_bytes
from shrike.layers.lm_head import LM_HEAD_QUANT, LMHead, int8_lm_head
from shrike.model.config import ModelConfig
from shrike.model.footprint import Footprint, checkpoint_tensor_bytes, footprint
from shrike.model.gguf_linear import GGUF_WEIGHTS, GGUFLinearFactory, native_activation_dtype
from shrike.model.llama import CausalLM
from shrike.model.weights import CheckpointTensors, GGUFTensors
from shrike.platform.memory import KVCachePlan, kv_bytes_per_token, plan_kv_cache, read_memory, return_freed_memory
from shrike.plugins import build_registry
from shrike.quantization.backends import ACTIVATION_QUANT, select_backend
from shrike.tokenizer import Tokenizer

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def resolve_dtype(name: str, config: ModelConfig) -> torch.dtype:
    if name == "auto":
        stored = config.raw.get("torch_dtype") or config.raw.get("dtype") or "bfloat16"
        return torch.bfloat16 if stored in ("bfloat16", "float16") else torch.float32
    if name not in DTYPES:
        raise ConfigError(f"--dtype {name!r} is not supported; use auto, float32 or bfloat16")
    return DTYPES[name]


@dataclass
class LoadedModel:
    model_dir: Path
    weights_source: Path  # the GGUF file a model runs from natively, else model_dir
    footprint: Footprint | None  # None when the config lacks the fields it counts
    config: ModelConfig
    tokenizer: Tokenizer
    model: CausalLM  # or a plugin architecture's model
    dtype: torch.dtype
    max_model_len: int
    weight_bytes: int
    available_bytes_before_load: int  # so that the KV-cache plan does not count the weights twice

    def kv_bytes_per_token(self, kv_dtype: torch.dtype) -> int:
        c = self.config
        return kv_bytes_per_token(c.num_layers, c.num_kv_heads, c.head_dim, *kv_cache_bytes(kv_dtype))

    def plan_kv_cache(self, space_gib: float | None, block_size: int, max_num_seqs: int,
                      kv_dtype: torch.dtype) -> KVCachePlan:
        c = self.config
        value_bytes, scale_bytes = kv_cache_bytes(kv_dtype)
        return plan_kv_cache(num_layers=c.num_layers, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                             kv_dtype_bytes=value_bytes, kv_scale_bytes=scale_bytes, block_size=block_size,
                             max_model_len=self.max_model_len, weight_bytes=self.weight_bytes,
                             kv_cache_space_gib=space_gib, max_num_seqs=max_num_seqs,
                             available_bytes=self.available_bytes_before_load)


def held_bytes(model) -> int:
    """Bytes of the distinct tensors reachable from the model's attributes (its weights as they are held)."""
    seen_objects, seen_tensors, total, todo = set(), set(), 0, [model]
    while todo:
        obj = todo.pop()
        if id(obj) in seen_objects or isinstance(obj, (type, str, bytes, int, float, types.ModuleType,
                                                       types.FunctionType, types.BuiltinFunctionType)):
            continue
        seen_objects.add(id(obj))
        if isinstance(obj, torch.Tensor):
            key = (obj.data_ptr(), obj.numel() * obj.element_size())
            if key not in seen_tensors:
                seen_tensors.add(key)
                total += key[1]
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            todo.extend(obj)
        elif hasattr(obj, "__dict__"):
            todo.extend(vars(obj).values())
    return total


def load_model(model: str | None, dtype: str = "auto", max_model_len: int | None = None,
               chat_template: str | None = None, progress: bool = True, kernel_backend: str = "auto",
               lm_head_quant: str = "none", activation_quant: str = "none", gguf_weights: str = "native") -> LoadedModel:
    if lm_head_quant not in LM_HEAD_QUANT:
        raise ConfigError(f"--lm-head-quant {lm_head_quant!r} is not known; use {' or '.join(LM_HEAD_QUANT)}")
    if activation_quant not in ACTIVATION_QUANT:
        raise ConfigError(f"--activation-quant {activation_quant!r} is not known; use {' or '.join(ACTIVATION_QUANT)}")
    if gguf_weights not in GGUF_WEIGHTS:
        raise ConfigError(f"--gguf-weights {gguf_weights!r} is not known; use {' or '.join(GGUF_WEIGHTS)}")
    gguf_file = gguf_source(model) if gguf_weights == "native" else None
    model_dir = resolve_model(model, weights=gguf_file is None)  # a file run natively is read from itself
    config = ModelConfig.from_dir(model_dir)
    registry = build_registry()
    architecture = registry.architecture(config.architecture).target
    gguf = read_gguf_model(gguf_file) if gguf_file else None  # shared: its metadata takes seconds to read
    torch_dtype = native_activation_dtype(gguf) if gguf and dtype == "auto" else resolve_dtype(dtype, config)
    select_backend(kernel_backend)  # an unknown name fails before anything loads
    ops = registry.op_table(kernel_backend)
    make_linear = None  # dense layers
    if config.quantization_config is not None:
        method = config.quantization_config.get("quant_method", "(none)")
        scheme = registry.quantization(method)
        extra = {"ops": ops, "activation_quant": activation_quant} if scheme.provider == "shrike" else {}
        make_linear = scheme.target(config, model_dir, torch_dtype, kernel_backend, **extra)
    if gguf_file is not None:
        make_linear = GGUFLinearFactory(gguf, config, torch_dtype, ops, native_head=lm_head_quant == "none")
    limit = config.max_position_embeddings
    if max_model_len is None:
        max_model_len = limit
    elif not 1 < max_model_len <= limit:
        raise ConfigError(f"--max-model-len {max_model_len} is outside what the model supports (2..{limit})")
    template = Path(chat_template).read_text() if chat_template and Path(chat_template).is_file() else chat_template
    tokenizer = Tokenizer(model_dir, chat_template=template)
    tensors = CheckpointTensors(model_dir) if gguf is None else GGUFTensors(gguf)
    available_before = read_memory().available_bytes
    action = make_linear.description if make_linear else "Loading"
    bar = tqdm(total=config.num_layers, desc=f"{action} {(gguf_file or model_dir).name}", unit="layer",
               disable=not progress)
    net = architecture(config, tensors, torch_dtype, make_linear=make_linear, max_positions=max_model_len,
                       progress=lambda done: bar.update(done - bar.n), ops=ops)
    bar.close()
    if isinstance(make_linear, GGUFLinearFactory):
        print(f"shrike: {gguf_file.name}: {make_linear.summary()}", file=sys.stderr)
        return_freed_memory()  # the blocks' unpacked values
    if lm_head_quant == "int8":
        if not isinstance(getattr(net, "lm_head", None), LMHead):
            raise ConfigError(f"--lm-head-quant int8 is not supported by the {config.architecture} architecture")
        net.lm_head = int8_lm_head(net.lm_head, model_dir, kernel_backend)  # the bf16 head and its tiles are freed
    # A file run from its blocks holds its own repacked tensors and the few it converted.
    weight_bytes = held_bytes(net) if gguf_file is not None else \
        sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    try:
        card = footprint(config.raw, tensors.stored_bytes() if gguf else checkpoint_tensor_bytes(model_dir))
    except KeyError:
        card = None
    return LoadedModel(model_dir, gguf_file or model_dir, card, config, tokenizer, net, torch_dtype, max_model_len,
                       weight_bytes, available_before)
