"""`nvllm bench --threads 1,2,4`: the thread counts the bench runs at, its whole measurement once per count,
each beside floors measured at that count (what a second thread buys shows only beside what it costs)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from nvllm.model.kernels import threads as kernel_threads


def thread_counts(text: str) -> list[int]:
    """The counts in `text` ("2", "1,2,4"), in order, each once; 0 stands for the default count. An argparse
    type: a bad entry raises ArgumentTypeError, which argparse prints after the flag's name."""
    counts: list[int] = []
    for entry in text.split(","):
        try:
            n = int(entry)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{entry.strip()!r} in {text!r} is not a whole number: give counts separated by commas, e.g. "
                f"1,2,4 (0: one per usable core but one)") from None
        if not 0 <= n <= kernel_threads.MAX:
            raise argparse.ArgumentTypeError(f"{n} in {text!r} is out of range: 0 (the default count) to "
                                             f"{kernel_threads.MAX} (the kernels' pool's limit)")
        if n not in counts:
            counts.append(n)
    return counts


def resolved(counts: Iterable[int]) -> list[int]:
    """0 made the default count (kernels/threads.py), and a count then named twice run once, order kept."""
    return list(dict.fromkeys(n if n > 0 else kernel_threads.default() for n in counts))
