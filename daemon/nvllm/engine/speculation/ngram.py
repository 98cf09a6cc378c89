"""Prompt lookup (vLLM's "ngram" speculation): the tokens that followed the last time the sequence's
latest n tokens appeared in its prompt or output are proposed as its next ones.

Copying what came before is what a model does when it quotes its input (a JSON record rewritten, log
lines summarised, code edited), so these proposals cost a search and no model at all. The longest
recurring n-gram within [n_min, n_max] wins, and of its earlier occurrences the latest one, which is
the likeliest continuation of what is being quoted now.
"""

from __future__ import annotations

import numpy as np


def propose(tokens: np.ndarray, k: int, n_min: int, n_max: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of tokens' last n tokens, for the
    largest n in [n_min, n_max] that recurs; [] when none does. tokens: [L] int64."""
    size = tokens.size
    if k <= 0 or size < n_min + 1:
        return []
    # Earlier places of the last token, latest first; then how many tokens before each match the ones
    # before the last, all candidates at once (a common token may recur hundreds of times).
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])[::-1]
    if not ends.size:
        return []
    length = np.ones(ends.size, dtype=np.int64)
    alive = np.ones(ends.size, dtype=bool)
    for j in range(1, min(n_max, size - 1)):
        idx = ends - j
        alive &= idx >= 0
        alive[alive] = tokens[idx[alive]] == tokens[size - 1 - j]
        if not alive.any():
            break
        length += alive
    best = int(np.argmax(length))        # the first of the longest: the latest
    if length[best] < n_min:
        return []
    end = int(ends[best])
    return tokens[end + 1:end + 1 + k].tolist()
