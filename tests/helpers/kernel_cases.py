"""What the C kernels' tests share (tests/model/kernels/test_kernel*.py): the mark that skips where the kernels were not
built, the switch to their NumPy twins, and a random paged-decode case with the shapes the models do not have."""

from __future__ import annotations

import numpy as np
import pytest

from nvllm.model.attention import AttentionMetadata
from nvllm.model.kernels import ops as kernels

needs_kernels = pytest.mark.skipif(kernels.lib is None, reason="the C kernels were not built")


def numpy_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "lib", None)


def random_decode_case(rng: np.random.Generator, S: int, nh: int, nkv: int, hd: int,
                       bs: int) -> tuple[np.ndarray, np.ndarray, AttentionMetadata]:
    """q [S, nh, hd], a K/V pool of pages of bs tokens and the metadata of S decoding sequences: the first
    exactly one full page long, the second a single token, block tables padded past every context."""
    ctx = rng.integers(1, 5 * bs + 1, S)
    ctx[0] = bs                                            # exactly one full page
    if S > 1:
        ctx[1] = 1                                         # a single token
    width = int(-(-ctx.max() // bs)) + 2                   # padded tables
    nb = S * width + 3
    pool = rng.standard_normal((2, nb, bs, nkv, hd), dtype=np.float32)
    tables = rng.permutation(nb)[:S * width].reshape(S, width).astype(np.int32)
    q = rng.standard_normal((S, nh, hd), dtype=np.float32) * 2
    meta = AttentionMetadata(slot_mapping=np.zeros(S, np.int64), query_lens=np.ones(S, np.int64),
                             context_lens=ctx.astype(np.int64), block_tables=tables, positions=ctx - 1)
    return q, pool, meta
