"""The daemon's heat monitor (server/board/heat_monitor.py): a change logged once (a warning with the reason and the
temperature when it throttles, info when it clears), the state sent to each engine once per change, an engine
loaded later brought to the current state, the loop reading a made tree in its own thread, and what Health and
the metrics report of it."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, cast

import pytest
from grpc_health.v1._async import HealthServicer
from prometheus_client.parser import text_string_to_metric_families

from helpers.sysfs_tree import add_zone, set_temp
from nvllm.config import PowerSettings
from nvllm.engine.async_engine import AsyncEngine
from nvllm.server.board.heat import HeatReading
from nvllm.server.board.heat_monitor import HeatMonitor
from nvllm.server.grpc.health_reply import health_reply
from nvllm.server.state import DaemonState


class FakeEngine:
    """What the monitor calls of an AsyncEngine, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[bool, float, float]] = []

    def set_throttle(self, on: bool, threads_fraction: float = 1.0, budget_fraction: float = 1.0) -> None:
        self.calls.append((on, threads_fraction, budget_fraction))


def monitor(engines: list[FakeEngine], **power: Any) -> HeatMonitor:
    settings = PowerSettings(**{"throttled_threads": 0.25, "throttled_budget": 0.5, **power})
    return HeatMonitor(settings, lambda: cast(list[AsyncEngine], list(engines)))


def at(celsius: float | None) -> HeatReading:
    return HeatReading(cpu_celsius=celsius)


def test_each_engine_is_told_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    engine = FakeEngine()
    m = monitor([engine])
    caplog.set_level(logging.INFO, "nvllm.server.heat")
    for c in (50, 60, 90, 92, 80, 70, 65):
        m.take(at(c))
    assert engine.calls == [(True, 0.25, 0.5), (False, 0.25, 0.5)]
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len(lines) == 2
    assert lines[0][0] == "WARNING" and "thermal throttle on: CPU at 90.0 C, at or above power.throttle_c 85 C" \
        in lines[0][1] and "(CPU 90.0 C)" in lines[0][1]
    assert lines[1][0] == "INFO" and lines[1][1].startswith("thermal throttle off: CPU 70.0 C")


def test_what_health_reads_follows_the_latest_reading() -> None:
    m = monitor([])
    assert (m.throttled, m.reason, m.cpu_celsius) == (False, "", None)
    m.take(at(88.5))
    assert (m.throttled, m.cpu_celsius) == (True, 88.5) and m.reason.startswith("CPU at 88.5 C")
    m.take(at(None))
    assert (m.throttled, m.reason, m.cpu_celsius) == (False, "", None)


def test_an_engine_loaded_later_gets_the_state_now_and_one_never_throttled_is_left_alone() -> None:
    first, later = FakeEngine(), FakeEngine()
    engines = [first]
    m = monitor(engines)
    m.take(at(50))
    assert first.calls == []                    # never throttled: nothing to send
    m.take(at(95))
    engines.append(later)
    m.take(at(95))
    assert first.calls == [(True, 0.25, 0.5)] and later.calls == [(True, 0.25, 0.5)]
    engines.remove(first)
    m.take(at(60))
    assert first.calls == [(True, 0.25, 0.5)] and later.calls[-1] == (False, 0.25, 0.5)


def test_the_loop_reads_a_tree_off_the_event_loop_and_stops(tmp_path: Path) -> None:
    zone = add_zone(tmp_path, 0, "cpu-thermal", 50_000)
    engine = FakeEngine()
    m = monitor([engine], sysfs_root=str(tmp_path), interval_s=0.01)

    async def main() -> list[bool]:
        states = []
        m.start()
        for milli in (90_000, 60_000):
            await asyncio.sleep(0.05)
            states.append(m.throttled)
            set_temp(zone, milli)
            for _ in range(200):
                await asyncio.sleep(0.01)
                if m.throttled == (milli > 85_000):
                    break
            states.append(m.throttled)
        await m.stop()
        return states

    assert asyncio.run(main()) == [False, True, True, False]
    assert engine.calls == [(True, 0.25, 0.5), (False, 0.25, 0.5)]
    assert m._task is None


def test_a_tree_with_nothing_to_read_says_so_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    m = monitor([], sysfs_root=str(tmp_path), interval_s=0.01)
    caplog.set_level(logging.INFO, "nvllm.server.heat")

    async def main() -> None:
        m.start()
        await asyncio.sleep(0.1)
        await m.stop()

    asyncio.run(main())
    assert [r.getMessage() for r in caplog.records] == [
        f"heat: no CPU thermal zone nor CPU clock readable under {tmp_path}: the board's heat is not watched"]


def test_health_and_metrics_report_the_heat_and_nothing_with_power_off() -> None:
    state = DaemonState("m", HealthServicer(), max_waiting=1, max_num_seqs=1, max_message_bytes=1 << 20)

    def series() -> dict[str, float]:
        body = state.metrics.exposition()[0].decode()
        return {s.name: s.value for f in text_string_to_metric_families(body) for s in f.samples
                if s.name in ("nvllm:thermal_throttled", "nvllm:cpu_temperature_celsius")}

    h = health_reply(state.read_health())
    assert (h.thermal_throttled, h.HasField("cpu_temperature_celsius"), h.throttle_reason) == (False, False, "")
    assert series() == {}
    state.heat = m = monitor([])
    m.take(at(None))                                  # no CPU zone: the state, never a temperature
    assert series() == {"nvllm:thermal_throttled": 0.0}
    assert not health_reply(state.read_health()).HasField("cpu_temperature_celsius")
    m.take(at(91.5))
    h = health_reply(state.read_health())
    assert (h.thermal_throttled, h.cpu_temperature_celsius) == (True, 91.5)
    assert h.throttle_reason == "CPU at 91.5 C, at or above power.throttle_c 85 C"
    assert series() == {"nvllm:thermal_throttled": 1.0, "nvllm:cpu_temperature_celsius": 91.5}
