"""The page pool's memory, backed in the background after start-up, whole blocks at a time.

The factory backs the first blocks of the pool (one max_model_len sequence) before the engine is built,
so the daemon is ready at once; a `PoolBacking` thread backs the rest, from the lowest block up, a chunk
of whole blocks at a time, and publishes how many of the first blocks are backed. The engine thread
reads that count before each step and hands the new blocks to the block manager, which offers no other:
no page of the pool is used before its memory is there, so the memory invariant (no page fault for memory
that is not there) holds as with a pool populated whole. Until the rest arrives the engine behaves as with
a smaller pool: a request that needs more pages than are backed waits.

Running out of memory while backing (MemoryError from `back`, e.g. madvise's ENOMEM) ends the backing:
it is logged, and the engine keeps serving with the blocks already backed, at least the first ones.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger("nvllm.engine.assembly.pool_backing")

CHUNK_BYTES = 32 << 20   # backed between two updates of the count: ~10 ms of the kernel's zeroing


class PoolBacking:
    def __init__(self, back: Callable[[int, int], None], backed: int, total: int, bytes_per_block: int,
                 chunk_bytes: int = CHUNK_BYTES) -> None:
        """back(start, stop) makes blocks [start, stop) resident (KVCache.back_blocks); blocks below
        `backed` already are. The count only grows, chunk by chunk, once a chunk's call returned."""
        if not 0 <= backed <= total:
            raise ValueError(f"backed must be in [0, {total}], got {backed}")
        self.total = total
        self.chunk_blocks = max(1, chunk_bytes // max(1, bytes_per_block))
        self.error: str | None = None     # why backing stopped short, once it has
        self.seconds = 0.0                # how long the background part took, once done
        self._back = back
        self._backed = backed
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        if backed == total:
            self._done.set()

    @property
    def backed(self) -> int:
        """How many of the first blocks are resident now (any thread may read it)."""
        with self._lock:
            return self._backed

    @property
    def in_progress(self) -> bool:
        return not self._done.is_set()

    def start(self) -> PoolBacking:
        if self._thread is None and self.in_progress:
            self._thread = threading.Thread(target=self._run, name="nvllm-pool-backing", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop after the chunk under way (the engine is being unloaded: nothing will use the rest)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until backing ended (all backed, or stopped short); False on timeout."""
        return self._done.wait(timeout)

    def _run(self) -> None:
        t0 = time.monotonic()
        first = self._backed
        try:
            # Linux nices threads one by one: requests' steps go before the backing on a busy board.
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        try:
            for start in range(first, self.total, self.chunk_blocks):
                if self._stop.is_set():
                    break
                stop = min(start + self.chunk_blocks, self.total)
                self._back(start, stop)
                with self._lock:
                    self._backed = stop
        except MemoryError as e:
            self.error = f"out of memory: {e}"
        except Exception as e:   # never fatal: the engine serves with what is backed
            log.exception("backing the page pool failed")
            self.error = f"{type(e).__name__}: {e}"
        self.seconds = time.monotonic() - t0
        if self._stop.is_set() and self.error is None:
            log.info("page pool: backing stopped at block %d of %d (the engine stopped)", self.backed, self.total)
        elif self.error is None:
            log.info("page pool backed in the background: blocks %d..%d in %.2f s", first, self.total,
                     self.seconds)
        else:
            log.error("page pool: backing stopped at block %d of %d after %.2f s (%s); serving with the %d "
                      "blocks backed", self.backed, self.total, self.seconds, self.error, self.backed)
        self._done.set()
