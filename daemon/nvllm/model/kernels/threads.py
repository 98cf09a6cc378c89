"""How many threads the matmul kernels and BLAS use: one count for both, set once by the engine."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nvllm.cgroup import CpuCount, usable_cpus

MAX = 64  # the C thread team's limit (csrc/matmul.c)


def default(cpus: CpuCount | None = None) -> int:
    """model.threads = 0: one per core this process may use (its affinity mask and its cgroup's CPU
    quota, nvllm/cgroup.py), but one, left to the gRPC loop and the board's other work."""
    return max(1, (cpus or usable_cpus()).count - 1)


count = min(MAX, default())   # the in-place kernels' threads; configure() keeps it with BLAS's


def configure(n: int = 0) -> int:
    """Sets BLAS's thread count for the process and the kernels' to n (0: default()); returns it."""
    from threadpoolctl import threadpool_limits

    global count
    if n <= 0:
        n = default()
    threadpool_limits(n, user_api="blas")
    count = min(MAX, max(1, int(n)))
    return n


def describe(n: int, setting: int, cpus: CpuCount | None = None) -> str:
    """The start-up log's account of n, the thread count configure() returned for model.threads =
    setting: how many threads compute (the calling engine thread is one of the team, csrc/team.c) and
    why that many; cpus: what default() read (usable_cpus() when not given)."""
    team = min(MAX, max(1, n))
    who = "the engine's own" if team == 1 else f"the engine's and {team - 1} more"
    if setting:
        why = f"model.threads = {setting}" + (f", the C team's most {MAX}" if n > MAX else "")
    else:
        cpus = cpus or usable_cpus()
        why = f"model.threads = 0: {cpus.source}, " + ("less one for the event loop" if cpus.count > 1
                                                       else "none to spare")
    return f"{team} matmul thread{'' if team == 1 else 's'} ({who}; {why})"


@contextmanager
def blas_one_thread() -> Iterator[None]:
    """BLAS on one thread while inside, for the calling thread and any other: where the caller shares work out
    over threads of its own. The process-wide limit alone does not reach a thread that OpenBLAS has already
    counted for (its thread-local count): an engine thread's calls stayed threaded, and on 2 cores beside the
    caller's own threads they queue on OpenBLAS's lock (a Whisper window's encoder took 0.8 s on the daemon's
    engine thread against 0.4 s on the main thread)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"):
        local = _openblas_local()
        old = local(1) if local is not None else None
        try:
            yield
        finally:
            if local is not None and old is not None:
                local(old)


_local: list[Any] = []   # [openblas_set_num_threads_local or None], looked up once


def _openblas_local() -> Any:
    if not _local:
        from threadpoolctl import threadpool_info

        fn = None
        for info in threadpool_info():
            if info.get("internal_api") == "openblas":
                try:
                    fn = ctypes.CDLL(info["filepath"]).openblas_set_num_threads_local
                    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
                except (OSError, AttributeError):
                    fn = None
                break
        _local.append(fn)
    return _local[0]
