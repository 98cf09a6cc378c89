"""The C kernels (nvllm/model/kernels/csrc/ops.c) against their NumPy twins, on shapes the models do not
have as well as those they do: odd head sizes, one-token pages, contexts of one token and of exactly
full pages, padded block tables, extreme activations."""

from __future__ import annotations

import importlib.machinery
import os
import shutil

import numpy as np
import pytest

from nvllm.model.attention import AttentionMetadata, _decode, _prefill
from nvllm.model.config import ModelConfig
from nvllm.model.decoder import ForwardBatch, Model, rms_norm, silu_mul
from nvllm.model.kernels import ops as kernels

needs_kernels = pytest.mark.skipif(kernels.lib is None, reason="the C kernels were not built")
# All of these also run on emulated aarch64 (deploy/aarch64-check.sh), where the kernels build for NEON.
pytestmark = pytest.mark.aarch64


def numpy_path(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "lib", None)


def test_kernels_are_built_where_a_compiler_is():
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here, so pip could not build the kernels")
    if os.environ.get("NVLLM_KERNELS") == "0":
        pytest.skip(kernels.describe())
    assert kernels.lib is not None, "a C compiler is present but nvllm/model/kernels/_ops*.so was not built"


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
@pytest.mark.parametrize("parts", [2, 3, 8, 40])
def test_decode_attention_split_over_the_matmul_pool_changes_no_bit(parts):
    """The sequences shared out over the matmul kernels' threads (more parts than sequences too) give
    every sequence the bits of one call over all of them."""
    from nvllm.model.kernels import matmul as mk

    if mk.lib is None:
        pytest.skip("the C matmul library (its thread pool) was not built")
    rng = np.random.default_rng(parts)
    q, pool, meta = random_decode_case(rng, 32, 9, 3, 64, 16)
    whole, split = np.full_like(q, np.nan), np.full_like(q, np.nan)
    kernels.PagedDecode(meta.block_tables, meta.context_lens)(q, pool, whole)
    pd = kernels.PagedDecode(meta.block_tables, meta.context_lens)
    for _ in range(2):   # the job made for this many parts, then used again
        split[:] = np.nan
        pd(q, pool, split, parts, mk.pool_run)
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


# -- what the wrappers refuse: every shape and index the C code would read or write out of bounds ---------

def decode_case(tables=((3, 0),), ctx=(3,), pool=(2, 4, 4, 1, 8), nh=2, q=None, out=None):
    """A PagedDecode and its call's arguments: pages of 4 tokens, one KV head of 8, two query heads."""
    hd = pool[-1]
    pd = kernels.PagedDecode(np.array(tables, np.int32), np.array(ctx, np.int64))
    q = np.zeros((len(ctx), nh, hd), np.float32) if q is None else q
    out = np.zeros((len(ctx), nh, hd), np.float32) if out is None else out
    return lambda: pd(q, np.zeros(pool, np.float32), out)


def rope_case(slots=(0, 5), nq=2, nkv=1, hd=8, pool=(2, 2, 4, 1, 8), qkv=None, cos=None, writable=True):
    T = len(slots)
    cos = np.zeros((T, hd // 2), np.float32) if cos is None else cos
    rw = kernels.RopeWriteKV(cos, np.zeros_like(cos), np.array(slots, np.int64), nq, nkv, hd, 1.0)
    qkv = np.zeros((T, (nq + 2 * nkv) * hd), np.float32) if qkv is None else qkv
    kv_pool = np.zeros(pool, np.float32)
    kv_pool.flags.writeable = writable
    return lambda: rw(qkv, kv_pool)


def read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


f32 = np.float32
REFUSED = {
    # PagedDecode: its tables and lengths, checked when it is made
    "tables of 1 dim": (lambda: kernels.PagedDecode(np.zeros(2, np.int32), np.array([1])),
                        "block_tables: need 2 dimensions"),
    "tables int64": (lambda: kernels.PagedDecode(np.zeros((1, 2), np.int64), np.array([1])),
                     "block_tables: need a C-contiguous int32"),
    "tables strided": (lambda: kernels.PagedDecode(np.zeros((2, 4), np.int32)[:, ::2], np.array([1, 1])),
                       "block_tables: need a C-contiguous int32 array, got int32 strided"),
    "a list for tables": (lambda: kernels.PagedDecode([[0]], np.array([1])), "block_tables: need a NumPy array"),
    "a row per sequence": (lambda: kernels.PagedDecode(np.zeros((2, 2), np.int32), np.array([1])),
                           r"block_tables: need one row per sequence \(1\), got 2"),
    "zero keys": (lambda: kernels.PagedDecode(np.zeros((2, 2), np.int32), np.array([3, 0])),
                  "context_lens: each must be at least 1, row 1 is 0"),
    "context_lens of 2 dims": (lambda: kernels.PagedDecode(np.zeros((1, 2), np.int32), np.array([[3]])),
                               "context_lens: need 1 dimensions"),
    # PagedDecode: every block id it will read, against the pool it is called with
    "context past its table": (decode_case(ctx=(9,)), "context_lens: row 0 has 9 tokens, 3 pages of 4, but its "
                                                      "block table holds 2"),
    "block past the pool": (decode_case(tables=((0, 0), (1, 4)), ctx=(3, 5)),
                            r"block_tables: row 1, page 1 is block 4, outside the pool's \[0, 4\)"),
    "negative block": (decode_case(tables=((0, 0), (-1, 2)), ctx=(3, 3)),
                       r"block_tables: row 1, page 0 is block -1, outside the pool's \[0, 4\)"),
    "negative block in a later page": (decode_case(tables=((0, -2),), ctx=(5,)),
                                       "block_tables: row 0, page 1 is block -2"),
    # PagedDecode: the pool, q and out of each call
    "pool of K only": (decode_case(pool=(1, 4, 4, 1, 8)), r"kv_pool: need \[2 \(K, V\), .*got \[1, 4, 4, 1, 8\]"),
    "pool of 3": (decode_case(pool=(3, 4, 4, 1, 8)), r"kv_pool: need \[2 \(K, V\)"),
    "pool of 4 dims": (decode_case(pool=(4, 4, 1, 8)), "kv_pool: need 5 dimensions"),
    "pages of 0 tokens": (decode_case(pool=(2, 4, 0, 1, 8)), "kv_pool: need .*block size >= 1"),
    "no KV heads": (decode_case(pool=(2, 4, 4, 0, 8)), "kv_pool: need .*KV heads >= 1"),
    "q of another head size": (decode_case(q=np.zeros((1, 2, 4), f32)), r"q: need float32 \[1, 2, 8\]"),
    "q with strided heads": (decode_case(q=np.zeros((1, 2, 16), f32)[:, :, ::2]), "q: need float32"),
    "q float64": (decode_case(q=np.zeros((1, 2, 8))), "q: need float32"),
    "q for another batch": (decode_case(q=np.zeros((2, 2, 8), f32)), r"q: need float32 \[1, 2, 8\]"),
    "out too short": (decode_case(out=np.zeros((1, 2, 4), f32)), r"out: need \[1, 2, 8\]"),
    "heads not a multiple": (decode_case(pool=(2, 4, 4, 2, 8), nh=3), "out: need .*a multiple of 2 KV heads"),
    "out read-only": (decode_case(out=read_only(np.zeros((1, 2, 8), f32))), "out: is written in place"),
    # softmax_causal_rows
    "zero keys in a row": (lambda: kernels.softmax_causal_rows(np.zeros((3, 2, 8), f32), np.array([0, 3])),
                           r"limits: each must be in \[1, 8\], row 0 is 0"),
    "past the width": (lambda: kernels.softmax_causal_rows(np.zeros((3, 2, 8), f32), np.array([3, 9])),
                       r"limits: each must be in \[1, 8\], row 1 is 9"),
    "4 limits for 6 rows": (lambda: kernels.softmax_causal_rows(np.zeros((3, 2, 8), f32), np.array([3, 3, 3, 3])),
                            "limits: need one per row.*4 do not divide 6 rows"),
    "no limits": (lambda: kernels.softmax_causal_rows(np.zeros((3, 2, 8), f32), np.zeros(0, np.int64)),
                  "limits: need one per row"),
    "limits int32": (lambda: kernels.softmax_causal_rows(np.zeros((2, 8), f32), np.array([3, 3], np.int32)),
                     "limits: need a C-contiguous int64"),
    "limits of 2 dims": (lambda: kernels.softmax_causal_rows(np.zeros((2, 8), f32), np.array([[3, 3]])),
                         "limits: need 1 dimensions"),
    "rows of no keys": (lambda: kernels.softmax_causal_rows(np.zeros((2, 0), f32), np.array([1, 1])),
                        "scores: need .*at least one key"),
    "scores of 1 dim": (lambda: kernels.softmax_causal_rows(np.zeros(8, f32), np.array([8])), "scores: need"),
    "scores read-only": (lambda: kernels.softmax_causal_rows(read_only(np.zeros((2, 8), f32)), np.array([1, 1])),
                         "scores: is written in place"),
    # silu_mul, rms_norm
    "gate_up float64": (lambda: kernels.silu_mul(np.zeros((2, 8))), "gate_up: need a C-contiguous float32"),
    "odd gate_up": (lambda: kernels.silu_mul(np.zeros((2, 7), f32)), "gate_up: need an even width"),
    "gate_up of 3 dims": (lambda: kernels.silu_mul(np.zeros((2, 2, 8), f32)), "gate_up: need 2 dimensions"),
    "weight too short": (lambda: kernels.rms_norm(np.zeros((2, 8), f32), np.ones(7, f32), 1e-5),
                         r"weight: need \[8\]"),
    "x strided": (lambda: kernels.rms_norm(np.zeros((8, 2), f32).T, np.ones(8, f32), 1e-5),
                  "x: need a C-contiguous"),
    "x of 1 dim": (lambda: kernels.rms_norm(np.zeros(8, f32), np.ones(8, f32), 1e-5), "x: need 2 dimensions"),
    # RopeWriteKV: made once per step, called per layer
    "negative slot": (lambda: rope_case(slots=(0, -1)), "slot_mapping: slots cannot be negative, token 1 has -1"),
    "slot past the pool": (rope_case(slots=(3, 8)), r"slot_mapping: token 1 has slot 8, outside the pool's \[0, 8\)"),
    "slots int32": (lambda: kernels.RopeWriteKV(np.zeros((1, 4), f32), np.zeros((1, 4), f32),
                                                np.zeros(1, np.int32), 2, 1, 8, 1.0), "slot_mapping: need"),
    "negative q heads": (lambda: rope_case(nq=-1), "num_q_heads: need an integer of at least 1, got -1"),
    "no KV heads to write": (lambda: rope_case(nkv=0), "num_kv_heads: need an integer of at least 1"),
    "odd head size": (lambda: rope_case(hd=7), "head_dim: need an even size"),
    "cos too short": (lambda: rope_case(cos=np.zeros((2, 3), f32)), r"cos, sin: need \[2, 4\]"),
    "cos for one token": (lambda: rope_case(cos=np.zeros((1, 4), f32)), r"cos, sin: need \[2, 4\]"),
    "qkv without v": (rope_case(qkv=np.zeros((2, 24), f32)), r"qkv: need \[2, 32\], got \[2, 24\]"),
    "qkv read-only": (rope_case(qkv=read_only(np.zeros((2, 32), f32))), "qkv: is written in place"),
    "pool of other heads": (rope_case(pool=(2, 2, 4, 2, 8)), "kv_pool: need 1 KV heads of 8, got 2 of 8"),
    "pool of K only to write": (rope_case(pool=(1, 4, 4, 1, 8)), r"kv_pool: need \[2 \(K, V\)"),
    "pool read-only": (rope_case(writable=False), "kv_pool: is written in place"),
}


@needs_kernels
@pytest.mark.parametrize("case", list(REFUSED))
def test_what_would_index_out_of_bounds_is_refused_by_name(case):
    call, reason = REFUSED[case]
    with pytest.raises(ValueError, match=reason):
        call()


@needs_kernels
def test_table_padding_past_a_context_is_never_read_so_may_hold_anything(monkeypatch):
    rng = np.random.default_rng(3)
    q, pool, meta = random_decode_case(rng, 5, 4, 2, 8, 4)
    pages = -(-meta.context_lens // 4)
    unused = np.arange(meta.block_tables.shape[1]) >= pages[:, None]
    tables = meta.block_tables.copy()
    tables[unused] = -7                                    # past the used pages: not checked, not read
    padded = np.zeros_like(q)
    kernels.PagedDecode(tables, meta.context_lens)(q, pool, padded)
    ref = np.zeros_like(q)
    kernels.PagedDecode(meta.block_tables, meta.context_lens)(q, pool, ref)
    np.testing.assert_array_equal(padded, ref)


@needs_kernels
def test_indices_changed_after_their_check_are_not_read():
    # Checked once per step, read every layer: the wrappers keep copies, so a later change to the
    # caller's arrays cannot slip an unchecked index past them.
    rng = np.random.default_rng(5)
    q, pool, meta = random_decode_case(rng, 3, 4, 2, 8, 4)
    tables, ctx = meta.block_tables.copy(), meta.context_lens.copy()
    ref = np.zeros_like(q)
    kernels.PagedDecode(tables, ctx)(q, pool, ref)
    pd = kernels.PagedDecode(tables, ctx)
    tables[:] = 10 ** 9
    ctx[:] = 10 ** 9
    out = np.zeros_like(q)
    pd(q, pool, out)
    np.testing.assert_array_equal(out, ref)
    slots = np.array([0, 5])
    rw = kernels.RopeWriteKV(np.ones((2, 4), np.float32), np.zeros((2, 4), np.float32), slots, 2, 1, 8, 1.0)
    slots[:] = 10 ** 9
    kv = np.zeros((2, 2, 4, 1, 8), np.float32)
    rw(np.ones((2, 32), np.float32), kv)
    assert kv.reshape(2, 8, 8)[:, [0, 5]].all() and not kv.reshape(2, 8, 8)[:, [1, 2, 3, 4, 6, 7]].any()


# -- NaN and inf: defined behaviour, carried through to the output (the model then refuses the logits) -------

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


def two_steps() -> list[ForwardBatch]:
    """Prompts of 5 and 3 tokens on pages 2 and 0 (pages of 4), then one decode token each."""
    prefill = ForwardBatch.build([5, 6, 7, 8, 9, 10, 11, 12], [0, 1, 2, 3, 4, 0, 1, 2],
                                 [8, 9, 10, 11, 4, 0, 1, 2], [5, 3], [5, 3], [[2, 1], [0, 0]], [4, 7])
    decode = ForwardBatch.build([13, 14], [5, 3], [5, 3], [1, 1], [6, 4], [[2, 1], [0, 0]], [0, 1])
    return [prefill, decode]


@pytest.mark.parametrize("absent", ["turned off", "not built"])
def test_without_the_library_the_model_runs_its_numpy_twins_and_describe_says_why(tiny, absent, monkeypatch):
    model = Model.from_dir(tiny)
    ref = None
    if kernels.lib is not None:
        cache = model.make_kv_cache(3, 4)
        ref = [model.forward(b, cache) for b in two_steps()]
    monkeypatch.setattr(kernels, "_why_not", kernels._why_not)          # restored afterwards
    if absent == "turned off":
        monkeypatch.setenv("NVLLM_KERNELS", "0")
    else:                                                               # no library file to be found
        monkeypatch.delenv("NVLLM_KERNELS", raising=False)
        monkeypatch.setattr(importlib.machinery, "EXTENSION_SUFFIXES", [".not-built.so"])
    monkeypatch.setattr(kernels, "lib", kernels._load())                # what importing kernels.py does
    assert kernels.lib is None
    why = {"turned off": "C kernels turned off by NVLLM_KERNELS=0", "not built": "C kernels not built"}[absent]
    assert kernels.describe().startswith(f"NumPy paths ({why}")

    def no_c(*args, **kwargs):
        raise AssertionError("a C kernel was called on the NumPy path")
    for name in ("PagedDecode", "RopeWriteKV", "softmax_causal_rows", "silu_mul", "rms_norm"):
        monkeypatch.setattr(kernels, name, no_c)
    cache = model.make_kv_cache(3, 4)
    ours = [model.forward(b, cache) for b in two_steps()]
    assert all(o.shape == (2, model.config.vocab_size) and np.isfinite(o).all() for o in ours)
    if ref is not None:                                                 # the twins compute the same
        for o, r in zip(ours, ref):
            np.testing.assert_allclose(o, r, atol=1e-4, rtol=1e-4)
