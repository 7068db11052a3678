"""The weight quantization schemes `shrike quantize` writes and the int8 kernels run: int4 per group and
int8 per channel, with dynamic int8 activations (W4A8, W8A8) or 16-bit ones (W4A16, W8A16)."""
from __future__ import annotations

from dataclasses import dataclass

from shrike.errors import ConfigError

W4A8_GROUP_SIZES = (128, 64, 32)


@dataclass(frozen=True)
class QuantScheme:
    weight_bits: int  # 4 or 8, symmetric
    group_size: int | None  # input features sharing one scale; None: one scale per output channel
    weight_only: bool = False  # True: activations stay 16-bit (W4A16 / W8A16)

    @property
    def name(self) -> str:
        acts = "a16" if self.weight_only else "a8"
        return f"w4{acts}-g{self.group_size}" if self.weight_bits == 4 else f"w8{acts}"

    @property
    def max_level(self) -> int:
        """Largest positive quantized value; the symmetric range is [-max_level - 1, max_level]."""
        return (1 << (self.weight_bits - 1)) - 1

    def check_in_features(self, in_features: int, layer: str) -> None:
        """Groups need not divide the width (the last one of a row is shorter), but the kernels run groups
        of gcd(G, K), a multiple of 32 only when K is."""
        if self.group_size is not None and in_features % 32:
            raise ConfigError(f"{self.name} needs input features divisible by 32, but {layer} has {in_features}")


SCHEMES = {s.name: s for only in (False, True)
           for s in [QuantScheme(4, g, only) for g in W4A8_GROUP_SIZES] + [QuantScheme(8, None, only)]}


def scheme_from_name(name: str) -> QuantScheme:
    if name not in SCHEMES:
        raise ConfigError(f"unknown quantization scheme {name!r}; supported: {', '.join(SCHEMES)}")
    return SCHEMES[name]
