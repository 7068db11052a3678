"""Linear layers of a compressed-tensors checkpoint: quantized GEMMs, or dense for ignored layers."""
from __future__ import annotations

from pathlib import Path

import torch

from shrike.errors import ConfigError
from shrike.layers.linear import DenseLinear, run_linear
from shrike.model.config import ModelConfig
from shrike.model.weights import CheckpointTensors
from shrike.platform.memory import FreedMemory
from shrike.quantization.backends import format_of, select_backend
from shrike.quantization.compressed_tensors_format import QuantizationPlan, read_stored_linear
from shrike.quantization.repack_cache import RepackCache
from shrike.quantization.safetensors_io import CheckpointFiles
from shrike.quantization.weight_forms import INT8_CONVERSION


class QuantizedLinear:
    checkpoint_parts: tuple[tuple[str, int], ...] = ()  # as DenseLinear's
    lora = None

    def __init__(self, weight, bias: torch.Tensor | None, format: str, out_features: int):
        self.weight = weight  # backend-specific packed weight, (N, K) logically
        self.bias = bias  # (N,) fp32 or None
        self.format = format  # "w4a8", "w8a8" or "weight_only" (shrike.weight_formats)
        self.op_name = f"{format}_linear"
        self.out_features = out_features

    def __call__(self, step, x, rows):
        """x (rows, K) -> (rows, N) in x's dtype, through step.ops."""
        return run_linear(step, self, x, rows)


class QuantizedLinearFactory:
    """The `make_linear` of CausalLM for a quantized checkpoint (see shrike.model.llama.LinearFactory)."""

    def __init__(self, config: ModelConfig, model_dir: Path, dtype: torch.dtype, kernel_backend: str, ops=None,
                 activation_quant: str = "none"):
        from shrike.ops import builtin_op_table

        self.ops = ops or builtin_op_table()  # shrike.registry.OpTable
        self.plan = QuantizationPlan(config.quantization_config)
        if not config.tie_word_embeddings and self.plan.layer("lm_head") is not None:
            raise ConfigError("a quantized lm_head is not supported; list lm_head in quantization_config.ignore")
        self.dtype = dtype
        self.backend = select_backend(kernel_backend)
        self.activation_quant = activation_quant  # for weight-only layers: "none" (16-bit) or "int8"
        self.files = CheckpointFiles(model_dir)
        # Weight-only layers are packed differently for int8 activations: a cache entry per choice, and a
        # new one whenever the conversion for the int8 kernels changes (weight_forms.INT8_CONVERSION).
        variant = self.backend.variant + (f"-int8act{INT8_CONVERSION}" if activation_quant == "int8" else "")
        self.cache = RepackCache(self.files, variant)
        self.freed = FreedMemory()  # checkpoint buffers, returned to the OS as they add up

    @property
    def description(self) -> str:
        """What loading mostly does, for the progress bar."""
        return "Loading" if self.cache.is_warm else "Repacking"

    def __call__(self, tensors: CheckpointTensors, prefixes: list[str], in_features: int, out_features: list[int],
                 bias: bool):
        layers = [self.plan.layer(p) for p in prefixes]
        if all(layer is None for layer in layers):
            return DenseLinear.load(tensors, prefixes, in_features, out_features, bias, self.dtype, self.ops.dense_linear)
        if any(layer != layers[0] for layer in layers):
            raise ConfigError(f"{', '.join(prefixes)} run as one fused GEMM but are not quantized alike; "
                              "quantize them with the same scheme or list all of them in ignore")
        biases = torch.cat([tensors.get(f"{p}.bias", (n,), torch.float32) for p, n in zip(prefixes, out_features)]) \
            if bias else None
        weight = self._weight(prefixes, layers[0], in_features, out_features)
        format = format_of(weight)
        layer = QuantizedLinear(weight, biases, format, sum(out_features))
        layer.checkpoint_parts, layer.in_features = tuple(zip(prefixes, out_features)), in_features
        return layer

    def _weight(self, prefixes, layer, in_features, out_features):
        name = prefixes[0]
        cached = self.cache.load(name)
        if cached is not None:
            return self.backend.restore(cached)
        stored = read_stored_linear(self.files, prefixes, layer, out_features, in_features)
        weight = self.backend.build(stored, self.activation_quant)
        weight = self.backend.restore(self.cache.store(name, weight.tensors()))
        nbytes = sum(t.numel() * t.element_size() for t in (stored.values, stored.packed, stored.float_values)
                     if t is not None)
        del stored
        self.freed.freed(nbytes)
        return weight



