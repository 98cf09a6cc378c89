"""The daemon's watch on the board's heat ([power]): every interval_s a reading (board/heat.py) taken in an
executor thread, the `Throttle` updated, and on a change one log line (a warning when it throttles, info
when it clears) and the state sent to every engine loaded (`AsyncEngine.set_throttle`: fewer matmul
threads and a smaller step budget, applied between steps).

The engines come from a callable asked at every reading, so a model loaded later gets the current state at
the next one. Health and the metrics read `throttled`, `reason` and `cpu_celsius` here; it lives on the
event loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable, Iterable

from nvllm.config import PowerSettings
from nvllm.engine.async_engine import AsyncEngine
from nvllm.server.board.heat import HeatReading, Throttle, read_heat

log = logging.getLogger("nvllm.server.heat")


class HeatMonitor:
    def __init__(self, power: PowerSettings, engines: Callable[[], Iterable[AsyncEngine]]) -> None:
        self.power = power
        self.engines = engines
        self.throttle = Throttle(power.throttle_c, power.resume_c)
        self.reading: HeatReading | None = None     # the latest; None before the first
        # The state each engine was last sent; an engine never sent one runs unthrottled.
        self._applied: weakref.WeakKeyDictionary[AsyncEngine, bool] = weakref.WeakKeyDictionary()
        self._task: asyncio.Task | None = None

    @property
    def throttled(self) -> bool:
        return self.throttle.throttled

    @property
    def reason(self) -> str:
        return self.throttle.reason

    @property
    def cpu_celsius(self) -> float | None:
        """The hottest CPU zone at the latest reading; None when no CPU zone was read."""
        return None if self.reading is None else self.reading.cpu_celsius

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="nvllm-heat")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        first = True
        while True:
            try:
                reading = await loop.run_in_executor(None, read_heat, self.power.sysfs_root)
            except Exception:   # sysfs is read defensively already: this is a bug, not the board
                log.exception("reading the board's heat failed")
            else:
                if first:
                    self._log_start(reading)
                    first = False
                self.take(reading)
            await asyncio.sleep(self.power.interval_s)

    def take(self, reading: HeatReading) -> None:
        """One reading: the state updated, a change logged once, every engine brought to the state."""
        self.reading = reading
        if self.throttle.update(reading):
            self._log_change()
        on = self.throttle.throttled
        for engine in self.engines():
            if self._applied.get(engine, False) != on:
                engine.set_throttle(on, self.power.throttled_threads, self.power.throttled_budget)
                self._applied[engine] = on

    def _log_start(self, reading: HeatReading) -> None:
        p = self.power
        if reading.cpu_celsius is None and not reading.ceiling_khz:
            log.warning("heat: no CPU thermal zone nor CPU clock readable under %s: the board's heat is not "
                        "watched", p.sysfs_root)
            return
        where = f"CPU at {reading.cpu_celsius:.1f} C" if reading.cpu_celsius is not None else "no CPU thermal zone"
        log.info("heat: %s (zones: %s), read every %g s under %s; throttles at %g C or a lowered CPU clock "
                 "ceiling, clears below %g C", where, ", ".join(reading.zones) or "none", p.interval_s,
                 p.sysfs_root, p.throttle_c, p.resume_c)

    def _log_change(self) -> None:
        p, t = self.power, self.cpu_celsius
        temp = "unknown" if t is None else f"{t:.1f} C"
        if self.throttle.throttled:
            log.warning("thermal throttle on: %s (CPU %s); matmul threads x%g, step token budget x%g (the whole "
                        "one while a request of priority < 0 runs or waits) until below %g C and uncapped",
                        self.throttle.reason, temp, p.throttled_threads, p.throttled_budget, p.resume_c)
        else:
            log.info("thermal throttle off: CPU %s, below %g C and uncapped; full matmul threads and step "
                     "budget again", temp, p.resume_c)
