"""Sliding-window attention (Gemma 3's local layers): a query at position p sees keys p - window + 1 .. p,
in the paged decode kernel, the prefill softmax and their NumPy twins alike, each checked against a
dense softmax over exactly those keys; windows shorter than, across and longer than a page; with Gemma 2's
attention soft-capping too, which a config may set."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_cases import needs_kernels, numpy_path, random_decode_case
from nvllm.model.attention import _decode, _prefill
from nvllm.model.kernels import ops as kernels
from nvllm.model.quant.kv_format import FORMATS_BY_NAME


def dense(q: np.ndarray, k: np.ndarray, v: np.ndarray, first: int, last: int,
          softcap: float | None = None) -> np.ndarray:
    """q [nh, hd] over keys first .. last (inclusive) of k, v [C, nkv, hd] -> [nh, hd], in float64."""
    nh, nkv = q.shape[0], k.shape[1]
    kk = np.repeat(k[first:last + 1], nh // nkv, axis=1).astype(np.float64)   # [n, nh, hd]
    s = np.einsum("hd,nhd->hn", q.astype(np.float64), kk)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return np.einsum("hn,nhd->hd", p, np.repeat(v[first:last + 1], nh // nkv, axis=1).astype(np.float64))


@pytest.mark.parametrize("window,bs,cap", [(1, 4, None), (5, 4, None), (8, 16, None), (21, 4, None),
                                           (1000, 16, None), (5, 4, 2.0), (0, 4, 2.0)])
def test_decode_sees_the_last_window_keys(window, bs, cap, kernel_path):
    rng = np.random.default_rng(window * 10 + bs)
    q, pool, meta = random_decode_case(rng, 6, 4, 2, 16, bs)
    out = np.full_like(q, np.nan)
    _decode(q, pool, meta, out, window, cap)
    for s in range(q.shape[0]):
        ctx = int(meta.context_lens[s])
        table = meta.block_tables[s, :-(-ctx // bs)]
        k, v = (pool[i][table].reshape(-1, 2, 16)[:ctx] for i in (0, 1))
        first = max(0, ctx - window) if window else 0
        np.testing.assert_allclose(out[s], dense(q[s], k, v, first, ctx - 1, cap), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("n,start,window,cap", [(40, 0, 8, None), (9, 30, 8, None), (1, 12, 3, None),
                                               (130, 5, 64, None), (20, 0, 50, None), (9, 30, 8, 1.5)])
def test_prefill_sees_the_last_window_keys(n, start, window, cap, kernel_path):
    """A chunk of n queries after `start` cached keys (chunked prefill across the window's edge too)."""
    rng = np.random.default_rng(n + start)
    c = start + n
    q = rng.standard_normal((n, 4, 16), dtype=np.float32) * 3
    k = rng.standard_normal((c, 2, 16), dtype=np.float32)
    v = rng.standard_normal((c, 2, 16), dtype=np.float32)
    out = _prefill(q, k, v, np.arange(start, c), window, cap)
    for i in range(n):
        p = start + i
        np.testing.assert_allclose(out[i], dense(q[i], k, v, max(0, p - window + 1), p, cap), atol=2e-5, rtol=1e-4)


@needs_kernels
def test_softmax_rows_are_zero_outside_start_to_limit():
    rng = np.random.default_rng(2)
    s = (rng.standard_normal((2, 3, 12)) * 5).astype(np.float32)
    limits, starts = np.array([3, 12, 7], np.int64), np.array([0, 4, 6], np.int64)
    ref = s.copy()
    sums = kernels.softmax_causal_rows(s, limits, starts)
    for r in range(3):
        a, b = starts[r], limits[r]
        e = np.exp(ref[:, r, a:b] - ref[:, r, a:b].max(axis=-1, keepdims=True))
        np.testing.assert_allclose(s[:, r, a:b], e, rtol=1e-5)
        assert not s[:, r, :a].any() and not s[:, r, b:].any()
        np.testing.assert_allclose(sums[:, r, 0], e.sum(axis=-1), rtol=1e-5)
    with pytest.raises(ValueError, match="starts"):
        kernels.softmax_causal_rows(s, limits, np.array([0, 12, 0], np.int64))


@needs_kernels
@pytest.mark.parametrize("name", ["f16", "q8_0"])
def test_decode_window_reads_every_kv_format_as_numpy_does(name, monkeypatch):
    """The kernel converts only the window's pages; the NumPy path decodes every page and masks."""
    fmt = FORMATS_BY_NAME[name]
    rng = np.random.default_rng(3)
    q, pool, meta = random_decode_case(rng, 5, 4, 2, 32, 4)
    pool = np.ascontiguousarray(fmt.encode(pool))
    ours = np.full_like(q, np.nan)
    _decode(q, pool, meta, ours, 6)
    numpy_path(monkeypatch)
    ref = np.full_like(q, np.nan)
    _decode(q, pool, meta, ref, 6)
    np.testing.assert_allclose(ours, ref, atol=2e-5, rtol=1e-4)
