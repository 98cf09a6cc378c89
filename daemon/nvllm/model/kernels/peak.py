"""The integer peak of the integer kernels' dot instructions (csrc/peak.h, each instruction set's loop in its
dot_*.c), on the kernels' thread team: what nvllm bench sets the integer kernels beside."""

from __future__ import annotations

import ctypes
import time

from nvllm.model.kernels import matmul
from nvllm.model.kernels.threads import MAX as MAX_THREADS

_I64 = ctypes.c_int64


class PeakJob(ctypes.Structure):
    _fields_ = [("v", ctypes.c_int), ("reps", _I64), ("done", _I64 * MAX_THREADS)]   # dot.c's peak_job_t


def int_peak_gops(variant: str, threads: int, seconds: float = 0.1) -> float:
    """The integer peak of `variant` (one of int_variants(), not "float") on `threads` threads of the
    kernels' thread team: its dot instruction's multiply-accumulates per second, counted as two operations
    each (as a GFLOP/s figure counts a multiply-add), in billions; the best of three runs of about `seconds` each."""
    if variant not in matmul.int_variants() or variant == "float":
        raise ValueError(f"variant: {variant!r} has no integer peak here (runs: {', '.join(matmul.int_variants())})")
    matmul.check_threads(threads)
    lib = matmul.lib
    assert lib is not None  # int_variants() is empty without it
    v = matmul.INT_VARIANTS[variant]
    reps = 1 << 12
    while True:   # rounds enough for `seconds` on one thread
        t = time.perf_counter()
        lib.dot_peak(v, reps)
        dt = time.perf_counter() - t
        if dt >= seconds / 4 or reps >= 1 << 40:
            break
        reps *= 4
    job = PeakJob(v, max(1, int(reps * seconds / max(dt, 1e-9))))
    part = ctypes.cast(lib.dot_peak_part, ctypes.c_void_p).value or 0
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        matmul.team_run(part, ctypes.addressof(job), threads)
        dt = time.perf_counter() - t
        best = max(best, 2 * sum(job.done[:threads]) / dt / 1e9)
    return best
