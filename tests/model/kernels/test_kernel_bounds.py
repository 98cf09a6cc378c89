"""What the C kernels' wrappers refuse: every shape and index the C code would read or write out of bounds is
refused by name before the call (PagedDecode's tables, lengths, pool, q and out; softmax_causal_rows; silu_mul;
rms_norm; RopeWriteKV), table padding past a context is never read, and indices changed after their check are
not read either (the wrappers keep copies)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_cases import needs_kernels, random_decode_case
from nvllm.model.kernels import ops as kernels

# All of these also run on emulated aarch64 (deploy/aarch64-check.sh), where the kernels build for NEON.
pytestmark = pytest.mark.aarch64


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
    "a list for tables": (lambda: kernels.PagedDecode([[0]], np.array([1])),  # type: ignore[arg-type]  # the refusal tested
                          "block_tables: need a NumPy array"),
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
