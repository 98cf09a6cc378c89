"""The memory-pressure watchdog: stops admitting requests before the board runs out of memory."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from nvllm.engine.assembly.memory import MemoryReading, format_bytes

log = logging.getLogger("nvllm.server.watchdog")


class MemoryWatchdog:
    """Stops admission when available memory falls below low_bytes; resumes above high_bytes.

    The gap between the two keeps admission from flapping around one threshold. read() is
    injected (available_memory in the daemon, fakes in tests). on_change(admitting, reason) runs
    on the watchdog's thread at each transition: keep it short and thread-safe (for asyncio, hand
    over with loop.call_soon_threadsafe).
    """

    def __init__(self, read: Callable[[], MemoryReading], low_bytes: int, high_bytes: int,
                 interval_s: float = 1.0,
                 on_change: Callable[[bool, str], object] | None = None) -> None:
        if not 0 <= low_bytes <= high_bytes:
            raise ValueError(f"need 0 <= low_bytes <= high_bytes, got {low_bytes}, {high_bytes}")
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.read = read
        self.low_bytes = low_bytes
        self.high_bytes = high_bytes
        self.interval_s = interval_s
        self.on_change = on_change
        self._lock = threading.Lock()
        self._admitting = True
        self._reason = ""
        self._last: MemoryReading | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def admitting(self) -> bool:
        with self._lock:
            return self._admitting

    @property
    def reason(self) -> str:
        """Why new requests are refused, with the figures; "" while admitting."""
        with self._lock:
            return self._reason

    @property
    def last_reading(self) -> MemoryReading | None:
        with self._lock:
            return self._last

    def _reason_for(self, reading: MemoryReading) -> str:
        return (f"available memory {format_bytes(reading.available_bytes)} ({reading.source}) is "
                f"below the low watermark {format_bytes(self.low_bytes)}; admission resumes above "
                f"{format_bytes(self.high_bytes)}")

    def check_once(self) -> bool:
        """Take one reading, update the state, fire on_change on a transition; returns admitting.

        A failing read keeps the previous state (logged), so a transient error neither blocks
        nor opens admission.
        """
        try:
            reading = self.read()
        except Exception:
            log.exception("memory watchdog: reading available memory failed; state unchanged")
            return self.admitting
        with self._lock:
            self._last = reading
            was = self._admitting
            if was and reading.available_bytes < self.low_bytes:
                self._admitting = False
            elif not was and reading.available_bytes > self.high_bytes:
                self._admitting = True
            # Refresh the figures while refusing, so health shows the current reading.
            self._reason = "" if self._admitting else self._reason_for(reading)
            admitting, reason = self._admitting, self._reason
        if admitting != was:
            if admitting:
                log.info("memory watchdog: admitting again, available memory %s (%s) is above %s",
                         format_bytes(reading.available_bytes), reading.source,
                         format_bytes(self.high_bytes))
            else:
                log.warning("memory watchdog: not admitting: %s", reason)
            if self.on_change is not None:
                try:
                    self.on_change(admitting, reason)
                except Exception:
                    log.exception("memory watchdog: on_change callback failed")
        return admitting

    def start(self) -> None:
        """Take a first reading now, then poll every interval_s on a daemon thread."""
        if self._thread is not None:
            raise RuntimeError("memory watchdog already started")
        self.check_once()
        self._thread = threading.Thread(target=self._run, name="nvllm-memory-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.check_once()

    def stop(self) -> None:
        """Stop polling and join the thread; safe to call twice or before start."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
