"""Prefill attention in C (csrc/attention.c's paged_prefill_part, kernels/prefill.py): several chunks of
one step, some after cached tokens, against the NumPy twin (model/attention.py) on shapes the models do
not have as well as those they do, in every KV format and with sliding windows; every token's rows with
the bits decode attention gives the same token, whatever the threads and the tasks; what the wrapper
refuses; NaN carried to the tokens that see it and no further."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_cases import needs_kernels, numpy_path
from nvllm.model.attention import AttentionMetadata, paged_attention
from nvllm.model.kernels import matmul as mk
from nvllm.model.kernels import ops as kernels
from nvllm.model.kernels.prefill import TILE, PagedPrefill
from nvllm.model.quant.kv_format import by_name, of_pool

pytestmark = pytest.mark.aarch64


def prefill_case(rng: np.random.Generator, chunks: list[tuple[int, int]], nh: int, nkv: int, hd: int, bs: int,
                 kv: str = "f32") -> tuple[np.ndarray, np.ndarray, AttentionMetadata]:
    """q [T, nh, hd], a pool in format kv and the metadata of one step whose sequences each prefill a chunk:
    chunks[i] = (tokens cached before, tokens in the chunk); one decode token after them when a chunk
    length is 1. Pages are scattered, tables padded."""
    fmt = by_name(kv)
    ctx = np.array([c + n for c, n in chunks])
    width = int(-(-ctx.max() // bs)) + 2
    nb = len(chunks) * width + 3
    pool = fmt.encode(rng.standard_normal((2, nb, bs, nkv, hd), dtype=np.float32))
    tables = rng.permutation(nb)[:len(chunks) * width].reshape(len(chunks), width).astype(np.int32)
    pos = np.concatenate([np.arange(c, c + n) for c, n in chunks])
    slots = np.concatenate([tables[i, p // bs] * bs + p % bs for i, p in
                            enumerate(np.split(pos, np.cumsum([n for _, n in chunks])[:-1]))])
    q = rng.standard_normal((pos.size, nh, hd), dtype=np.float32) * 2
    meta = AttentionMetadata(slot_mapping=slots.astype(np.int64), query_lens=np.array([n for _, n in chunks]),
                             context_lens=ctx.astype(np.int64), block_tables=tables, positions=pos.astype(np.int64))
    return q, pool, meta


def attend(q: np.ndarray, pool: np.ndarray, meta: AttentionMetadata, window: int = 0) -> np.ndarray:
    """paged_attention, given the step's keys and values as the pool holds them at their slots."""
    nb, bs, nkv, width = pool.shape[1:]
    k, v = (of_pool(pool).decode(pool[i].reshape(nb * bs, nkv, width)[meta.slot_mapping]) for i in (0, 1))
    return paged_attention(q, k, v, pool, meta, window)


def rebuilt(meta: AttentionMetadata) -> AttentionMetadata:
    return AttentionMetadata(meta.slot_mapping, meta.query_lens, meta.context_lens, meta.block_tables, meta.positions)


CASES = [  # chunks, nh, nkv, hd, bs, kv
    ([(0, 40), (17, 23), (0, 1)], 9, 3, 64, 16, "f32"),
    ([(0, 70)], 14, 2, 64, 16, "f16"),
    ([(5, 33), (0, 3)], 6, 2, 20, 3, "bf16"),
    ([(0, 19), (31, 12)], 4, 4, 24, 4, "f32"),
    ([(0, 9)], 8, 1, 8, 1, "f32"),
    ([(2, 45)], 4, 2, 64, 16, "q8_0"),
    ([(0, 37)], 12, 2, 128, 16, "f16"),
]


@needs_kernels
@pytest.mark.parametrize("window", [0, 5, 16])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_prefill_attention_matches_numpy(case: int, window: int, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks, nh, nkv, hd, bs, kv = CASES[case]
    q, pool, meta = prefill_case(np.random.default_rng(case), chunks, nh, nkv, hd, bs, kv)
    assert meta.paged_prefill is not None
    ours = attend(q, pool, meta, window)
    numpy_path(monkeypatch)
    ref = attend(q, pool, rebuilt(meta), window)
    np.testing.assert_allclose(ours, ref, atol=3e-5, rtol=1e-4)


@needs_kernels
@pytest.mark.parametrize("parts", [1, 2, 3, 8])
@pytest.mark.parametrize("window", [0, 7])
def test_each_token_gets_the_bits_decode_gives_it(parts: int, window: int) -> None:
    """Token t of a chunk, prefilled with any number of threads taking the tasks, has the output decode
    attention gives a query at t with t + 1 keys."""
    rng = np.random.default_rng(parts)
    chunks = [(0, 3 * TILE + 5), (20, 2 * TILE)]
    q, pool, meta = prefill_case(rng, chunks, 9, 3, 64, 16, "f16")
    pp = meta.paged_prefill
    assert pp is not None
    out = np.full_like(q, np.nan)
    if parts == 1:
        pp(q, pool, out, window=window)
    else:
        if mk.lib is None:
            pytest.skip("the C matmul library (its thread team) was not built")
        for _ in range(2):   # the tasks made once, then handed out again
            pp(q, pool, out, parts, mk.team_run, window)
    seq = np.repeat(np.arange(len(chunks)), meta.query_lens)
    decode = kernels.PagedDecode(np.ascontiguousarray(meta.block_tables[seq]), meta.positions + 1)
    one_by_one = np.full_like(q, np.nan)
    decode(q, pool, one_by_one, window=window)
    np.testing.assert_array_equal(out, one_by_one)


@needs_kernels
def test_tasks_cover_every_token_and_head_once_heaviest_first() -> None:
    q, pool, meta = prefill_case(np.random.default_rng(0), [(0, 50), (100, 7), (0, 1)], 4, 2, 8, 4)
    pp = meta.paged_prefill
    assert pp is not None
    tasks = pp.tasks(2, 0)
    seen = np.zeros((q.shape[0], 2), int)
    starts, lens = meta.query_starts[meta.prefill_rows], meta.query_lens[meta.prefill_rows]
    for s, h, a, b in tasks:
        assert 0 < b - a <= TILE and starts[s] <= a and b <= starts[s] + lens[s]   # rows of sequence s's chunk
        seen[a:b, h] += 1
    prefill_rows = np.arange(57)
    assert (seen[prefill_rows] == 1).all() and (seen[57:] == 0).all()
    work = [int((meta.positions[a:b] + 1).sum()) + 16 * (b - a) for _, _, a, b in tasks]
    assert work == sorted(work, reverse=True)


@needs_kernels
def test_a_nan_key_reaches_the_tokens_that_see_it_only() -> None:
    rng = np.random.default_rng(1)
    q, pool, meta = prefill_case(rng, [(0, 30)], 4, 2, 8, 4)
    t = 11
    pool[0, meta.block_tables[0, t // 4], t % 4, 1] = np.nan     # key 11 of KV head 1
    out = attend(q, pool, meta)
    assert np.isfinite(out[:t]).all() and np.isfinite(out[:, :2]).all()
    assert np.isnan(out[t:, 2:]).all()
    assert np.isfinite(attend(q, pool, meta, window=3)[t + 3:]).all()   # past the window it is not seen


def made(fn) -> str:
    with pytest.raises(ValueError) as e:
        fn()
    return str(e.value)


@needs_kernels
def test_what_would_read_out_of_bounds_is_refused_by_name() -> None:
    i32, i64 = np.int32, np.int64
    tables, ctx = np.array([[2, 0]], i32), np.array([6], i64)
    starts, lens, pos = np.array([0], i64), np.array([4], i64), np.arange(2, 6, dtype=i64)
    assert "positions: chunk 0 has positions 3 .. 6, outside its context of 6" in made(
        lambda: PagedPrefill(tables, ctx, starts, lens, pos + 1))
    assert "starts, lens: each chunk needs rows inside the batch's 4" in made(
        lambda: PagedPrefill(tables, ctx, starts, np.array([5], i64), pos))
    assert "lens: need one per block-table row (1), got 2" in made(
        lambda: PagedPrefill(tables, ctx, starts, np.array([2, 2], i64), pos))
    assert "block_tables: need a C-contiguous int32" in made(
        lambda: PagedPrefill(tables.astype(i64), ctx, starts, lens, pos))
    pp = PagedPrefill(tables, ctx, starts, lens, pos)
    q, out = np.zeros((4, 2, 8), np.float32), np.zeros((4, 2, 8), np.float32)
    assert "block_tables: row 0, page 0 is block 2, outside the pool's [0, 2)" in made(
        lambda: pp(q, np.zeros((2, 2, 4, 1, 8), np.float32), out))
    pool = np.zeros((2, 3, 4, 1, 8), np.float32)
    assert "context_lens: row 0 has 6 tokens, 3 pages of 2, but its block table holds 2" in made(
        lambda: pp(q, np.zeros((2, 3, 2, 1, 8), np.float32), out))
    assert "q: need float32 [4, 2, 8]" in made(lambda: pp(np.zeros((3, 2, 8), np.float32), pool, out))
    assert "out: need [4, 2, 8]" in made(lambda: pp(q, pool, np.zeros((5, 2, 8), np.float32)))
    pp(q, pool, out)   # and the right arguments pass
