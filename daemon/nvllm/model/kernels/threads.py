"""How many threads the matmul kernels and BLAS use: one count for both, set once by the engine."""

from __future__ import annotations

from nvllm.cgroup import usable_cpus

MAX = 64  # the C pool's limit (csrc/matmul.c)


def default() -> int:
    """model.threads = 0: one per core this process may use (its affinity mask and its cgroup's CPU
    quota, nvllm/cgroup.py), but one, left to the gRPC loop and the board's other work."""
    return max(1, usable_cpus().count - 1)


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
