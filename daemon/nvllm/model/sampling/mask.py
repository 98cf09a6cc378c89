"""Allowed-token masks (structured output): logits of the tokens a row may not take become -inf.

The engine hands over one packed bitmask row per constrained row, int32 words with bit t % 32 of word
t // 32 set when token t is allowed (llguidance's layout). Tokens past the mask's width are not allowed.
This runs before every other sampling step, so penalties, temperature, truncation, the draw and the
logprobs all see the constrained distribution; rows without a mask are not touched.
"""

from __future__ import annotations

import numpy as np


def masked(logits: np.ndarray, rows: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """A new float32 [N, V] array: logits, where rows[i] keeps only the tokens bits[i] [ceil(V/32)] allows
    (-inf elsewhere). The copy and the mask are one pass over the constrained rows."""
    n, vocab = logits.shape
    words = np.ascontiguousarray(bits, dtype="<i4")  # little-endian words: bit order = token order
    allowed = np.unpackbits(words.view(np.uint8), axis=1, count=vocab, bitorder="little").view(bool)  # [C, V]
    if len(rows) == n and np.array_equal(rows, np.arange(n)):
        return np.where(allowed, logits, np.float32(-np.inf)).astype(np.float32, copy=False)
    out = np.array(logits, dtype=np.float32, order="C", copy=True)
    out[rows] = np.where(allowed, out[rows], np.float32(-np.inf))
    return out
