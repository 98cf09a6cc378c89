"""An encoder's attention in C (kernels/encoder_attention.py) against its NumPy twin: softmax(q k^T scale) v within
each sequence of a packed batch, for sequences shorter and longer than a block of keys (64) and a tile of
queries (16), head sizes with and without a whole number of 8-lane vectors, on one part and on the thread team;
and the shapes it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from nvllm.model.kernels import matmul, ops
from nvllm.model.kernels.encoder_attention import encoder_attention, tasks

pytestmark = [pytest.mark.aarch64,
              pytest.mark.skipif(ops.lib is None or matmul.lib is None, reason="the C kernels are not built")]


def twin(qkv: np.ndarray, starts: np.ndarray, lens: np.ndarray, nh: int, hd: int, scale: float) -> np.ndarray:
    out = np.empty((qkv.shape[0], nh * hd), np.float64)
    for a, n in zip(starts, lens):
        q, k, v = qkv[a:a + n].astype(np.float64).reshape(n, 3, nh, hd).transpose(1, 2, 0, 3)
        s = q @ k.transpose(0, 2, 1) * scale
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        out[a:a + n] = ((p / p.sum(axis=-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(n, nh * hd)
    return out


@pytest.mark.parametrize("hd", [8, 20, 32, 64])
@pytest.mark.parametrize("parts", [1, 3])
def test_each_sequence_attends_to_all_of_itself_and_nothing_else(hd: int, parts: int) -> None:
    rng = np.random.default_rng(hd + parts)
    nh, lens = 3, np.array([1, 5, 17, 64, 65, 130], np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    qkv = rng.standard_normal((int(lens.sum()), 3 * nh * hd)).astype(np.float32)
    out = np.full((qkv.shape[0], nh * hd), np.nan, np.float32)
    scale = hd ** -0.5
    encoder_attention(qkv, starts, lens, nh, hd, scale, out, parts, matmul.team_run)
    np.testing.assert_allclose(out, twin(qkv, starts, lens, nh, hd, scale), rtol=0, atol=2e-5)


def test_the_tasks_cover_every_row_and_head_once_longest_first() -> None:
    starts, lens = np.array([0, 3, 40], np.int64), np.array([3, 37, 20], np.int64)
    t = tasks(starts, lens, 2)
    assert list(t[0][:2]) == [3, 37] and list(t[-1][:2]) == [0, 3]
    rows = {(int(a) + int(r), int(h)) for a, n, h, t0 in t for r in range(t0, min(t0 + 16, n))}
    assert rows == {(r, h) for r in range(60) for h in range(2)}


def test_wrong_shapes_are_refused_by_name() -> None:
    qkv, out = np.zeros((10, 24), np.float32), np.zeros((10, 8), np.float32)
    with pytest.raises(ValueError, match="qkv, out"):
        encoder_attention(qkv, np.array([0]), np.array([10]), 2, 4, 0.5, np.zeros((10, 9), np.float32))
    with pytest.raises(ValueError, match="starts, lens"):
        encoder_attention(qkv, np.array([5]), np.array([10]), 2, 4, 0.5, out)
    with pytest.raises(ValueError, match="qkv: need a C-contiguous float32"):
        encoder_attention(qkv[:, ::2].copy().astype(np.float64), np.array([0]), np.array([10]), 2, 4, 0.5, out)
