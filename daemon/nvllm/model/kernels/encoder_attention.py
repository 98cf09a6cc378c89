"""An encoder's attention in C (csrc/attention.c's encoder_attention_part): every token of a sequence sees all
of it, keys and values read in place from the step's qkv rows, in tasks of TILE query rows and one head shared
out over the kernels' thread team, each row's softmax online as the paged kernels keep it."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

from nvllm.model.kernels.ops import _check, _ptr, lib, run_parts

_I64 = ctypes.c_int64
_P = ctypes.c_void_p
TILE = 16   # query rows a task takes: a block of keys read once serves them all


class _EncoderJob(ctypes.Structure):
    """csrc/ops.h's encoder_job_t."""
    _fields_ = [("qkv", _P), ("out", _P), ("tasks", _P), ("n_tasks", _I64), ("tile", _I64), ("nh", _I64),
                ("hd", _I64), ("scale", ctypes.c_float), ("failed", ctypes.c_int), ("next", _I64)]


def tasks(starts: np.ndarray, lens: np.ndarray, nh: int) -> np.ndarray:
    """[n, 4] int64 (first row, length, head, first query row), the longest sequences' first: a task costs its
    sequence's length, so the shared counter hands the dear ones out first and the threads finish together."""
    rows = [(a, n, h, t) for a, n in sorted(zip(starts.tolist(), lens.tolist()), key=lambda x: -x[1])
            for h in range(nh) for t in range(0, n, TILE)]
    return np.asarray(rows, np.int64).reshape(-1, 4)


def encoder_attention(qkv: np.ndarray, starts: np.ndarray, lens: np.ndarray, nh: int, hd: int, scale: float,
                      out: np.ndarray, parts: int = 1, team_run: Callable[[int, int, int], None] | None = None) -> None:
    """qkv [T, 3 nh hd] float32 (each token's q, k, v; q unscaled), the sequences rows starts[s] ..
    starts[s] + lens[s] - 1 -> out [T, nh hd]: softmax(q k^T scale) v within each sequence."""
    _check(qkv, np.float32, "qkv", ndim=2)
    _check(out, np.float32, "out", ndim=2, written=True)
    T = qkv.shape[0]
    if qkv.shape[1] != 3 * nh * hd or out.shape != (T, nh * hd):
        raise ValueError(f"qkv, out: need [{T}, {3 * nh * hd}] and [{T}, {nh * hd}], got {list(qkv.shape)} "
                         f"and {list(out.shape)}")
    if lens.size and (lens.min() < 1 or starts.min() < 0 or int((starts + lens).max()) > T):
        raise ValueError(f"starts, lens: each sequence needs rows inside the batch's {T}")
    work = tasks(starts, lens, nh)
    job = _EncoderJob(qkv=_ptr(qkv), out=_ptr(out), tasks=_ptr(work), n_tasks=work.shape[0], tile=TILE, nh=nh,
                      hd=hd, scale=scale, failed=0, next=0)
    assert lib is not None  # callers run this only with the library loaded
    run_parts(lib.encoder_attention_part, _PART, job, min(int(parts), work.shape[0]), team_run, "encoder_attention")


_PART: int = (ctypes.cast(lib.encoder_attention_part, ctypes.c_void_p).value or 0) if lib is not None else 0
