"""Shrike: a CPU-native LLM serving engine."""

__version__ = "0.1.0"
