"""Conversion of other checkpoint formats into Hugging Face-style model directories."""

from shrike.convert.gguf import CONVERTER_VERSION, convert_gguf

__all__ = ["CONVERTER_VERSION", "convert_gguf"]
