"""NaN and inf in the C kernels: defined behaviour, carried through to the output (the model then refuses the
logits), and only within the sequence, row or element they are in; what lies past a limit or a context is
never read. The NumPy twin of paged decode agrees."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_cases import needs_kernels, numpy_path, random_decode_case
from nvllm.model.attention import _decode
from nvllm.model.kernels import ops as kernels

# All of these also run on emulated aarch64 (deploy/aarch64-check.sh), where the kernels build for NEON.
pytestmark = pytest.mark.aarch64


@needs_kernels
def test_softmax_carries_nan_and_inf_through_and_ignores_them_past_the_limit():
    s = np.tile(np.linspace(-3, 2, 8, dtype=np.float32), (5, 1))
    s[0, 2] = np.nan                                       # NaN within the limit: the row is NaN
    s[1, 3] = np.inf                                       # inf - inf: NaN
    s[2, 1] = -np.inf                                      # a key that gets no weight
    s[3, 6] = np.nan                                       # past the row's limit: never read
    limits = np.array([8, 8, 8, 5, 8], np.int64)
    ref = s[4].astype(np.float64)
    out = s.copy()
    sums = kernels.softmax_causal_rows(out, limits)[:, 0]
    assert np.isnan(sums[0]) and np.isnan(out[0, 2])
    assert np.isnan(sums[1]) and np.isnan(out[1]).any()
    assert np.isfinite(out[2]).all() and out[2, 1] < 1e-37
    np.testing.assert_allclose(out[2, [0, *range(2, 8)]], np.exp(ref - ref.max())[[0, *range(2, 8)]], rtol=4e-6)
    e = np.exp(ref[:5] - ref[:5].max())
    np.testing.assert_allclose(out[3, :5], e, rtol=4e-6)
    assert not out[3, 5:].any() and np.isfinite(sums[3])
    np.testing.assert_allclose(out[4], np.exp(ref - ref.max()), rtol=4e-6)


@needs_kernels
def test_decode_attention_carries_nan_through_its_sequence_only(monkeypatch):
    rng = np.random.default_rng(4)
    q, pool, meta = random_decode_case(rng, 4, 4, 2, 8, 4)
    ctx, tables = meta.context_lens, meta.block_tables
    clean = np.zeros_like(q)
    kernels.PagedDecode(tables, ctx)(q, pool, clean)
    pool[:, tables[0, 0], 0] = np.nan                      # a key and value of sequence 0
    assert ctx[1] == 1 and ctx[1] < ctx.max()
    pool[:, tables[1, 0], 1:] = np.nan                     # sequence 1's page, past its one token
    pool[:, tables[2, -1]] = np.inf                        # a padding page of sequence 2: never read
    out = np.zeros_like(q)
    kernels.PagedDecode(tables, ctx)(q, pool, out)
    assert np.isnan(out[0]).all()
    np.testing.assert_array_equal(out[1:], clean[1:])
    numpy_path(monkeypatch)                                # the NumPy twin agrees, stale slots and all
    ref = np.full_like(q, 7.0)
    _decode(q, pool, meta, ref)
    assert np.isnan(ref[0]).all()
    np.testing.assert_allclose(ref[1:], out[1:], atol=2e-5, rtol=1e-4)


@needs_kernels
def test_silu_mul_rms_norm_and_rope_carry_nan_and_inf_through():
    x = np.array([np.nan, np.inf, -np.inf, 1.0, -2.0, 0.0], np.float32)
    gu = np.concatenate([x, np.full_like(x, 3.0)])[None, :]             # [1, 2I]: gate | up
    got = kernels.silu_mul(gu)[0]
    assert np.isnan(got[0]) and got[1] == np.inf and not np.isfinite(got[2])
    g = x[3:].astype(np.float64)
    np.testing.assert_allclose(got[3:], g / (1 + np.exp(-g)) * 3.0, rtol=1e-6)
    rows = np.ones((3, 8), np.float32)
    rows[0, 5], rows[1, 2] = np.nan, np.inf
    normed = kernels.rms_norm(rows, np.ones(8, np.float32), 1e-5)
    assert np.isnan(normed[0]).all() and not np.isfinite(normed[1]).all()
    np.testing.assert_allclose(normed[2], 1.0, rtol=1e-5)
    nq, nkv, hd = 2, 1, 8
    qkv = np.ones((2, (nq + 2 * nkv) * hd), np.float32)
    qkv[0, 3] = np.nan                                      # in q of token 0
    qkv[1, (nq + nkv) * hd] = np.inf                        # in v of token 1
    pool = np.zeros((2, 2, 4, nkv, hd), np.float32)
    cos, sin = np.ones((2, hd // 2), np.float32), np.zeros((2, hd // 2), np.float32)
    kernels.RopeWriteKV(cos, sin, np.array([1, 6]), nq, nkv, hd, 1.0)(qkv, pool)
    assert np.isnan(qkv[0, [3, 7]]).all()                   # the element and its rotary pair (NaN * 0)
    assert np.isfinite(np.delete(qkv[0], [3, 7])).all()
    flat = pool.reshape(2, 8, hd)
    assert flat[1, 6, 0] == np.inf and np.isfinite(flat[0]).all()

