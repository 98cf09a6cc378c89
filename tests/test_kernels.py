"""The C kernels (nvllm/model/csrc/kernels.c) against their NumPy twins, on shapes the models do not
have as well as those they do: odd head sizes, one-token pages, contexts of one token and of exactly
full pages, padded block tables, extreme activations."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from nvllm.model import kernels
from nvllm.model.attention import AttentionMetadata, _decode, _prefill
from nvllm.model.decoder import Model, rms_norm, silu_mul
from nvllm.model.loader import ModelConfig

needs_kernels = pytest.mark.skipif(kernels.lib is None, reason="the C kernels were not built")
# All of these also run on emulated aarch64 (deploy/aarch64-check.sh), where the kernels build for NEON.
pytestmark = pytest.mark.aarch64


def numpy_path(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "lib", None)


def test_kernels_are_built_where_a_compiler_is():
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here, so pip could not build the kernels")
    assert kernels.lib is not None, "a C compiler is present but nvllm/model/_kernels*.so was not built"


def random_decode_case(rng, S, nh, nkv, hd, bs):
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
    model = Model(cfg, None)
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


@needs_kernels
def test_bad_arrays_are_refused_by_name():
    good = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match="gate_up"):
        kernels.silu_mul(good.astype(np.float64))
    with pytest.raises(ValueError, match="gate_up: need an even width"):
        kernels.silu_mul(np.zeros((2, 7), np.float32))
    with pytest.raises(ValueError, match="weight: need \\[8\\]"):
        kernels.rms_norm(np.zeros((2, 8), np.float32), np.ones(7, np.float32), 1e-5)
    for bad in ([0, 3], [3, 9], [3, 3, 3, 3]):                     # zero keys, past the width, 4 for 6 rows
        with pytest.raises(ValueError, match="limits"):
            kernels.softmax_causal_rows(np.zeros((3, 2, 8), np.float32), np.array(bad, np.int64))
    with pytest.raises(ValueError, match="x: need a C-contiguous"):
        kernels.rms_norm(np.zeros((8, 2), np.float32).T, np.ones(8, np.float32), 1e-5)
    pool = np.zeros((2, 4, 4, 1, 8), np.float32)
    q, out = np.zeros((1, 2, 8), np.float32), np.zeros((1, 2, 8), np.float32)
    with pytest.raises(ValueError, match="context_lens"):
        kernels.PagedDecode(np.zeros((1, 2), np.int32), np.array([0]))
    with pytest.raises(ValueError, match="block_tables"):          # 9 tokens do not fit two pages of 4
        kernels.PagedDecode(np.zeros((1, 2), np.int32), np.array([9]))(q, pool, out)
    with pytest.raises(ValueError, match="block_tables"):          # block 4 is outside a pool of 4
        kernels.PagedDecode(np.array([[4, 0]], np.int32), np.array([3]))(q, pool, out)
    with pytest.raises(ValueError, match="q: need float32"):
        kernels.PagedDecode(np.zeros((1, 2), np.int32), np.array([3]))(q[:, :, ::2], pool, out)


@needs_kernels
def test_a_library_from_another_version_is_refused_with_the_fix(monkeypatch):
    before = kernels._why_not
    monkeypatch.setattr(kernels, "ABI", kernels.ABI + 1)
    try:
        assert kernels._load() is None
        assert "reinstall nvllm" in kernels._why_not and "ABI" in kernels._why_not
    finally:
        kernels._why_not = before
    assert kernels.describe() == "C kernels"


def test_describe_names_the_numpy_path_and_why(monkeypatch):
    monkeypatch.setattr(kernels, "lib", None)
    monkeypatch.setattr(kernels, "_why_not", "C kernels turned off by NVLLM_KERNELS=0")
    assert kernels.describe() == "NumPy paths (C kernels turned off by NVLLM_KERNELS=0)"
