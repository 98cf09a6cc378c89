"""Prefill attention in C (csrc/attention.c's paged_prefill_part): a step's prefill chunks against their
pages, in tasks of TILE tokens and one KV head, shared out over the kernels' thread team. Each token's
rows get the bits decode attention gives the same token (PagedDecode), whatever the chunk or the tile."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

from nvllm.model.kernels.ops import _check, _ptr, check_pool, check_q_out, check_tables, lib, run_parts

_I64 = ctypes.c_int64
_P = ctypes.c_void_p

# Tokens per task: a page of keys, converted once per task, serves TILE tokens' query heads; 16 leaves a
# 512-token chunk of a model with two KV heads 64 tasks to share out.
TILE = 16


class _PrefillJob(ctypes.Structure):
    """csrc/ops.h's prefill_job_t."""
    _fields_ = [("q", _P), ("q_stride", _I64), ("k_pool", _P), ("v_pool", _P), ("block_tables", _P),
                ("table_stride", _I64), ("tasks", _P), ("positions", _P), ("out", _P), ("n_tasks", _I64),
                ("tile", _I64), ("nh", _I64), ("nkv", _I64), ("hd", _I64), ("bs", _I64), ("window", _I64),
                ("fmt", ctypes.c_int), ("failed", ctypes.c_int), ("next", _I64)]


class PagedPrefill:
    """Prefill attention for one step: the chunks of sequences with more than one new token.

    block_tables [S, MB] int32 and context_lens [S] are the chunks' sequences'; starts and lens [S] their
    tokens' rows in the step's batch, positions [T] every row's position. They are checked and copied
    once; then the object is called layer after layer with that layer's q [T, nh, hd] (scaled; rows may
    be strided, heads contiguous), pool and out [T, nh, hd], of which it writes the chunks' rows only."""

    def __init__(self, block_tables: np.ndarray, context_lens: np.ndarray, starts: np.ndarray, lens: np.ndarray,
                 positions: np.ndarray) -> None:
        _check(block_tables, np.int32, "block_tables", ndim=2)
        for name, a in (("context_lens", context_lens), ("starts", starts), ("lens", lens)):
            _check(a, np.int64, name, ndim=1)
            if a.size != block_tables.shape[0]:
                raise ValueError(f"{name}: need one per block-table row ({block_tables.shape[0]}), got {a.size}")
        _check(positions, np.int64, "positions", ndim=1)
        if lens.size and (lens.min() < 1 or starts.min() < 0 or (starts + lens).max() > positions.size):
            raise ValueError(f"starts, lens: each chunk needs rows inside the batch's {positions.size}")
        for s in range(lens.size):
            p = positions[starts[s]:starts[s] + lens[s]]
            if p.min() < 0 or p.max() >= context_lens[s]:
                raise ValueError(f"positions: chunk {s} has positions {int(p.min())} .. {int(p.max())}, outside "
                                 f"its context of {int(context_lens[s])}")
        self._tables, self._ctx = block_tables.copy(), context_lens.copy()
        self._positions = positions.copy()
        self._chunks = [(int(a), int(n)) for a, n in zip(starts, lens)]
        self.num_tokens = positions.size
        self._checked: tuple[int, int] | None = None
        self._tasks: dict[tuple[int, int], np.ndarray] = {}   # by (KV heads, window)

    def tasks(self, nkv: int, window: int) -> np.ndarray:
        """[n, 4] int64 (block-table row, KV head, first row, end row), heaviest first: a task's keys read
        are about its tokens times the keys each sees, so the shared counter hands the long ones out first
        and the threads finish together."""
        key = (nkv, window)
        if key not in self._tasks:
            rows, work = [], []
            for s, (start, n) in enumerate(self._chunks):
                for a in range(start, start + n, TILE):
                    b = min(a + TILE, start + n)
                    seen = self._positions[a:b] + 1
                    cost = int(np.minimum(seen, window).sum() if window else seen.sum()) + 16 * (b - a)
                    for h in range(nkv):
                        rows.append((s, h, a, b))
                        work.append(cost)
            order = np.argsort(-np.asarray(work, np.int64), kind="stable")
            self._tasks[key] = np.ascontiguousarray(np.asarray(rows, np.int64).reshape(-1, 4)[order])
        return self._tasks[key]

    def addresses(self, num_blocks: int, block_size: int, nkv: int) -> tuple[int, int, int, int, int]:
        """(block tables, their row stride, tasks, how many, positions): the checked copies' addresses and the
        tasks for nkv KV heads, for a kernel that attends within a pool of num_blocks pages of block_size
        (kernels/step.py's, which runs a whole step's layers)."""
        if self._checked != (num_blocks, block_size):
            check_tables(self._tables, self._ctx, num_blocks, block_size)
            self._checked = (num_blocks, block_size)
        tasks = self.tasks(nkv, 0)
        return _ptr(self._tables), self._tables.shape[1], _ptr(tasks), tasks.shape[0], _ptr(self._positions)

    def __call__(self, q: np.ndarray, kv_pool: np.ndarray, out: np.ndarray, parts: int = 1,
                 team_run: Callable[[int, int, int], None] | None = None, window: int = 0) -> None:
        nb, bs, nkv, hd, fmt = check_pool(kv_pool, written=False)
        nh = check_q_out(q, out, self.num_tokens, nkv, hd)
        if self._checked != (nb, bs):
            check_tables(self._tables, self._ctx, nb, bs)
            self._checked = (nb, bs)
        window = max(0, int(window))
        tasks = self.tasks(nkv, window)
        k = _ptr(kv_pool)
        job = _PrefillJob(q=_ptr(q), q_stride=q.strides[0] // 4, k_pool=k, v_pool=k + kv_pool[0].nbytes,
                          block_tables=_ptr(self._tables), table_stride=self._tables.shape[1], tasks=_ptr(tasks),
                          positions=_ptr(self._positions), out=_ptr(out), n_tasks=tasks.shape[0], tile=TILE,
                          nh=nh, nkv=nkv, hd=hd, bs=bs, window=window, fmt=fmt.code, failed=0, next=0)
        assert lib is not None  # callers run this only with the library loaded
        run_parts(lib.paged_prefill_part, _PART, job, min(int(parts), tasks.shape[0]), team_run, "paged_prefill")


# paged_prefill_part's address (a loaded symbol's is never NULL, so `or 0` only types it)
_PART: int = (ctypes.cast(lib.paged_prefill_part, ctypes.c_void_p).value or 0) if lib is not None else 0
