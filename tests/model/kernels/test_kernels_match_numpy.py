"""The C kernels (nvllm/model/kernels/csrc/ops.c) against their NumPy twins, on shapes the models do not
have as well as those they do: odd head sizes, one-token pages, contexts of one token and of exactly
full pages, padded block tables, extreme activations; paged decode attention split over the thread team
changing no bit, and the split by work it uses."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_cases import needs_kernels, numpy_path, random_decode_case
from nvllm.model.attention import _decode, _prefill
from nvllm.model.config import ModelConfig
from nvllm.model.decoder import Model, gelu_tanh_mul, rms_norm, silu_mul
from nvllm.model.kernels import ops as kernels

# All of these also run on emulated aarch64 (deploy/aarch64-check.sh), where the kernels build for NEON.
pytestmark = pytest.mark.aarch64


@needs_kernels
@pytest.mark.parametrize("S,nh,nkv,hd,bs", [(32, 9, 3, 64, 16), (5, 14, 2, 64, 16), (3, 4, 4, 24, 4),
                                             (7, 8, 1, 8, 1), (1, 9, 3, 64, 16), (4, 6, 2, 20, 3)])
def test_decode_attention_matches_numpy(S, nh, nkv, hd, bs, monkeypatch):
    rng = np.random.default_rng(S * 100 + hd)
    q, pool, meta = random_decode_case(rng, S, nh, nkv, hd, bs)
    # As in the model, q is a strided view into a wider qkv row.
    qkv = np.zeros((S, nh + 2 * nkv, hd), np.float32)
    qkv[:, :nh] = q
    q = qkv[:, :nh]
    ours = np.full_like(q, np.nan)
    _decode(q, pool, meta, ours)
    numpy_path(monkeypatch)
    ref = np.full_like(q, np.nan)
    _decode(q, pool, meta, ref)
    np.testing.assert_allclose(ours, ref, atol=2e-5, rtol=1e-4)


@needs_kernels
@pytest.mark.parametrize("parts", [2, 3, 8, 40])
def test_decode_attention_split_over_the_thread_team_changes_no_bit(parts):
    """The sequences shared out over the matmul kernels' threads (more parts than sequences too) give
    every sequence the bits of one call over all of them."""
    from nvllm.model.kernels import matmul as mk

    if mk.lib is None:
        pytest.skip("the C matmul library (its thread team) was not built")
    rng = np.random.default_rng(parts)
    q, pool, meta = random_decode_case(rng, 32, 9, 3, 64, 16)
    whole, split = np.full_like(q, np.nan), np.full_like(q, np.nan)
    kernels.PagedDecode(meta.block_tables, meta.context_lens)(q, pool, whole)
    pd = kernels.PagedDecode(meta.block_tables, meta.context_lens)
    for _ in range(2):   # the job made for this many parts, then used again
        split[:] = np.nan
        pd(q, pool, split, parts, mk.team_run)
        np.testing.assert_array_equal(split, whole)


def test_split_by_work_cuts_contiguous_runs_of_about_equal_keys():
    rng = np.random.default_rng(0)
    for ctx in (np.array([500, 10, 10, 10, 480, 20]), rng.integers(1, 2000, 37), np.array([7])):
        work = ctx + 16
        for parts in (2, 3, 8):
            b = kernels.split_by_work(ctx, parts)
            assert len(b) == parts + 1 and b[0] == 0 and b[-1] == ctx.size and np.all(np.diff(b) >= 0)
            most = max(work[b[p]:b[p + 1]].sum() for p in range(parts))
            assert most <= work.sum() / parts + work.max(), (ctx, parts, b)
    assert list(kernels.split_by_work(np.array([500, 10, 10, 10, 480, 20]), 2)) == [0, 2, 6]   # 542 / 584


@needs_kernels
def test_decode_attention_single_key_returns_its_value():
    rng = np.random.default_rng(0)
    pool = rng.standard_normal((2, 4, 16, 2, 8), dtype=np.float32)
    q = rng.standard_normal((1, 4, 8), dtype=np.float32) * 50  # large scores: softmax of one key is 1
    out = np.empty_like(q)
    kernels.PagedDecode(np.array([[3, 0]], np.int32), np.array([1]))(q, pool, out)
    expect = np.repeat(pool[1, 3, 0], 2, axis=0)           # each KV head serves two query heads
    np.testing.assert_allclose(out[0], expect, rtol=1e-6)


@needs_kernels
@pytest.mark.parametrize("n,start,nh,nkv", [(300, 0, 9, 3), (37, 50, 14, 2), (1, 0, 4, 4), (129, 7, 6, 2)])
def test_prefill_attention_matches_numpy(n, start, nh, nkv, monkeypatch):
    rng = np.random.default_rng(n)
    hd, c = 16, start + n
    q = rng.standard_normal((n, nh, hd), dtype=np.float32) * 3
    k = rng.standard_normal((c, nkv, hd), dtype=np.float32)
    v = rng.standard_normal((c, nkv, hd), dtype=np.float32)
    pos = np.arange(start, c)
    ours = _prefill(q, k, v, pos)
    numpy_path(monkeypatch)
    np.testing.assert_allclose(ours, _prefill(q, k, v, pos), atol=2e-5, rtol=1e-4)


@needs_kernels
def test_softmax_is_exact_enough_and_zero_past_the_limit():
    rng = np.random.default_rng(1)
    s = (rng.standard_normal((2, 6, 40)) * 30).astype(np.float32)
    s[0, 0, :] = np.linspace(-200, 0, 40)                  # far below exp's range: must give 0, not NaN
    limits = np.array([1, 5, 17, 39, 40, 40], np.int64)
    ref = s.astype(np.float64)
    out = s.copy()
    sums = kernels.softmax_causal_rows(out, limits)
    for r in range(12):
        lim = limits[r % 6]
        row = ref.reshape(12, 40)[r, :lim]
        e = np.exp(row - row.max())
        got = out.reshape(12, 40)[r]
        np.testing.assert_allclose(got[:lim], e, rtol=4e-6, atol=1e-37)
        assert not got[lim:].any()
        np.testing.assert_allclose(sums.reshape(12)[r], e.sum(), rtol=1e-6)


@needs_kernels
def test_silu_mul_matches_numpy_including_extremes(monkeypatch):
    x = np.array([-1e4, -100, -88, -87, -20, -1, -1e-6, 0, 1e-6, 1, 20, 87, 88, 100, 1e4], np.float32)
    gate = np.stack([x, -x])                                            # [2, I]
    gu = np.concatenate([gate, np.full_like(gate, 3.0)], axis=1)         # [2, 2I]: gate | up
    ours = silu_mul(gu)
    g64 = gate.astype(np.float64)
    ref = g64 * np.exp(-np.logaddexp(0, -g64)) * 3.0                     # silu without overflow
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-30)


@needs_kernels
def test_gelu_tanh_mul_matches_numpy_and_torchs_formula(monkeypatch):
    x = np.array([-1e4, -100, -10, -3, -1, -1e-6, 0, 1e-6, 0.5, 1, 3, 10, 100, 1e4], np.float32)
    gu = np.concatenate([np.stack([x, -x]), np.full((2, x.size), 3.0, np.float32)], axis=1)   # gate | up
    ours = gelu_tanh_mul(gu)
    g64 = np.stack([x, -x]).astype(np.float64)
    ref = 0.5 * g64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64 ** 3))) * 3.0   # gelu_pytorch_tanh
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
    numpy_path(monkeypatch)
    np.testing.assert_allclose(gelu_tanh_mul(gu), ours, rtol=1e-5, atol=1e-6)

@needs_kernels
@pytest.mark.parametrize("T,H", [(1, 576), (33, 896), (4, 7)])
def test_rms_norm_matches_numpy(T, H, monkeypatch):
    rng = np.random.default_rng(T)
    x = rng.standard_normal((T, H), dtype=np.float32) * 5
    w = rng.standard_normal(H, dtype=np.float32)
    ours = rms_norm(x, w, 1e-5)
    numpy_path(monkeypatch)
    np.testing.assert_allclose(ours, rms_norm(x, w, 1e-5), rtol=2e-6, atol=1e-6)


@needs_kernels
@pytest.mark.parametrize("nh,nkv,hd", [(9, 3, 64), (14, 2, 64), (4, 4, 6)])
def test_rope_and_kv_write_match_numpy(nh, nkv, hd, monkeypatch):
    cfg = ModelConfig(architecture="LlamaForCausalLM", vocab_size=10, hidden_size=nh * hd, intermediate_size=8,
                      num_layers=1, num_heads=nh, num_kv_heads=nkv, head_dim=hd, rms_norm_eps=1e-5,
                      rope_theta=10000.0, max_position_embeddings=8192, tie_word_embeddings=True,
                      attention_bias=False)
    model = Model(cfg, None)  # type: ignore[arg-type]  # no weights: only its rope tables and scale are used
    rng = np.random.default_rng(hd)
    qkv = rng.standard_normal((5, (nh + 2 * nkv) * hd), dtype=np.float32)
    cos, sin = model._rope_tables(np.array([0, 1, 7, 300, 4095]))
    slots = np.array([3, 17, 0, 40, 22])
    pool = np.zeros((2, 6, 8, nkv, hd), np.float32)
    ours = qkv.copy()
    kernels.RopeWriteKV(cos, sin, slots, nh, nkv, hd, model.scale)(ours, pool)
    q_ref, k_ref = model._rotate(qkv.copy(), cos, sin)
    np.testing.assert_allclose(ours[:, :nh * hd].reshape(5, nh, hd), q_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours[:, nh * hd:(nh + nkv) * hd].reshape(5, nkv, hd), k_ref, rtol=1e-5, atol=1e-6)
    flat = pool.reshape(2, 48, nkv, hd)
    np.testing.assert_array_equal(flat[0, slots], ours[:, nh * hd:(nh + nkv) * hd].reshape(5, nkv, hd))
    np.testing.assert_array_equal(flat[1, slots], qkv[:, (nh + nkv) * hd:].reshape(5, nkv, hd))
    untouched = np.setdiff1d(np.arange(48), slots)
    assert not flat[:, untouched].any()
    with pytest.raises(ValueError, match="slot_mapping"):
        kernels.RopeWriteKV(cos, sin, slots + 40, nh, nkv, hd, model.scale)(qkv.copy(), pool)

