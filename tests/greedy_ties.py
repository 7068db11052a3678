"""Greedy comparisons that a near-tie cannot break.

Two computations of one model that differ only in rounding (a kernel and its reference, int8 and bf16
weights) choose different greedy tokens wherever the top two logits are closer than that rounding, and
from there their texts part for good: comparing texts tests the prompt's near-ties, not the kernels.
Instead, one run's greedy tokens are fed to the other model, and each must be that model's own choice
or lose to it by at most a small logit margin.
"""
import torch

from shrike.eval_ppl import sequence_logits


def greedy_gaps(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """How far each of `tokens` (another run's greedy continuation of `prompt`) falls below `model`'s best
    logit, `model` being fed the same prefix: (len(tokens),), 0 where `model` chooses that token too."""
    logits = sequence_logits(model, prompt + tokens[:-1])[len(prompt) - 1:]  # (len(tokens), vocab)
    chosen = logits.gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1)
    return logits.max(-1).values - chosen
