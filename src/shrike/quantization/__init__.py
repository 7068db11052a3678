"""Quantized checkpoints: W4A8 / W8A8 schemes, the compressed-tensors format, quantizer and loading."""
