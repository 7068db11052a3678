"""`shrike convert SRC.gguf DST --quantize SCHEME`: the GGUF dequantized, then re-quantized to
Shrike's W4A8 or W8A8 compressed-tensors format, in one command."""

from __future__ import annotations

import tempfile
from pathlib import Path

from shrike.convert.gguf import check_output_dir, convert_gguf
from shrike.errors import ConfigError


def convert_and_quantize(src: Path, dst: Path, scheme_name: str, progress: bool = True) -> None:
    from shrike.quantization.quantize_checkpoint import quantize_checkpoint
    from shrike.quantization.schemes import scheme_from_name

    scheme = scheme_from_name(scheme_name)
    check_output_dir(dst)
    if (dst / "config.json").exists():
        raise ConfigError(f"{dst} already holds a checkpoint; choose an empty output directory")
    dst.parent.mkdir(parents=True, exist_ok=True)
    # The bf16 intermediate lives next to the output, on the same disk, and goes away afterwards.
    with tempfile.TemporaryDirectory(prefix=".shrike-dequantized-", dir=dst.parent) as staging:
        convert_gguf(src, Path(staging), progress=progress)
        fmt = "pack-quantized" if scheme.weight_bits == 4 else "int-quantized"
        quantize_checkpoint(Path(staging), dst, scheme, fmt, progress=progress)
