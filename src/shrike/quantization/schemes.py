"""The weight quantization schemes Shrike runs: int4 per group (W4A8) and int8 per channel (W8A8)."""
from __future__ import annotations

from dataclasses import dataclass

from shrike.errors import ConfigError

W4A8_GROUP_SIZES = (128, 64, 32)


@dataclass(frozen=True)
class QuantScheme:
    weight_bits: int  # 4 or 8, symmetric
    group_size: int | None  # input features sharing one scale; None: one scale per output channel

    @property
    def name(self) -> str:
        return f"w4a8-g{self.group_size}" if self.weight_bits == 4 else "w8a8"

    @property
    def max_level(self) -> int:
        """Largest positive quantized value; the symmetric range is [-max_level - 1, max_level]."""
        return (1 << (self.weight_bits - 1)) - 1

    def check_in_features(self, in_features: int, layer: str) -> None:
        if self.group_size is not None and in_features % self.group_size:
            usable = [g for g in W4A8_GROUP_SIZES if in_features % g == 0]
            hint = f"; use {' or '.join(f'w4a8-g{g}' for g in usable)}" if usable else ""
            raise ConfigError(f"{self.name} needs input features divisible by {self.group_size}, "
                              f"but {layer} has {in_features}{hint}")


SCHEMES = {s.name: s for s in [QuantScheme(4, g) for g in W4A8_GROUP_SIZES] + [QuantScheme(8, None)]}
SUPPORTED_SCHEMES_TEXT = ("symmetric int4 weights per group of 128, 64 or 32 with dynamic int8 activations (W4A8), "
                          "or symmetric int8 weights per output channel with dynamic per-token int8 activations (W8A8)")


def scheme_from_name(name: str) -> QuantScheme:
    if name not in SCHEMES:
        raise ConfigError(f"unknown quantization scheme {name!r}; supported: {', '.join(SCHEMES)}")
    return SCHEMES[name]
