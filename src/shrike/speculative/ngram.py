"""Prompt lookup: propose what followed the last place the sequence's current ending occurred before."""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def propose_ngram(token_ids: np.ndarray, num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """token_ids: (L,) the prompt and output so far -> up to num_tokens proposed next tokens.

    Among earlier occurrences of the last min_n tokens, the one whose match extends furthest back
    (up to max_n tokens) wins; on ties, one followed by num_tokens tokens, then the most recent. What
    followed it is the proposal.
    """
    length = token_ids.shape[0]
    if num_tokens <= 0 or length <= min_n:
        return []
    suffix = token_ids[length - min_n:]
    # Windows starting at 0 .. length-min_n-1: each has at least one token after it.
    windows = sliding_window_view(token_ids[:length - 1], min_n)  # (length - min_n, min_n)
    starts = np.flatnonzero((windows == suffix).all(axis=1))
    if starts.size == 0:
        return []
    matched = np.full(starts.shape, min_n)
    alive = np.ones(starts.shape, dtype=bool)
    for extra in range(min_n, max_n):
        target = length - extra - 1  # the next earlier token of the current ending
        if target < 0:
            break
        before = starts - (extra - min_n) - 1  # the token preceding each match so far
        ok = alive & (before >= 0)
        ok[ok] = token_ids[before[ok]] == token_ids[target]
        if not ok.any():
            break
        alive = ok
        matched[alive] += 1
    # Longest match first, then a continuation as long as wanted (a match near the end has a short one),
    # then the most recent.
    continuation = np.minimum(length - (starts + min_n), num_tokens)
    best = np.lexsort((starts, continuation, matched))[-1]
    begin = starts[best] + min_n
    return token_ids[begin:begin + num_tokens].tolist()
