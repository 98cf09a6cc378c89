"""The board's heat (server/board/heat.py) on made sysfs trees: the CPU's zones found by x86's and Jetson's names,
millidegrees read as degrees, unreadable or sentinel files skipped, clock caps told from power modes, and the
throttle's hysteresis."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers.sysfs_tree import ORIN_ZONES, X86_ZONES, add_cpu, add_zone, board, set_ceiling, write
from nvllm.server.board.heat import HeatReading, Throttle, read_heat


def test_an_orin_reads_its_hottest_cpu_zone_and_never_the_gpu(tmp_path: Path) -> None:
    board(tmp_path, {**ORIN_ZONES, "gpu-thermal": 95_000})
    r = read_heat(tmp_path)
    assert r.zones == {**{k: v / 1000 for k, v in ORIN_ZONES.items()}, "gpu-thermal": 95.0}
    assert r.cpu_celsius == 49.0          # tj-thermal, the junction: hotter than cpu-thermal, the GPU aside


@pytest.mark.parametrize(("kind", "cpu"), [
    ("cpu-thermal", True), ("CPU-therm", True), ("BCPU-therm", True), ("MCPU-therm", True), ("tj-thermal", True),
    ("soc0-thermal", True), ("soc2-thermal", True), ("x86_pkg_temp", True), ("coretemp", True), ("k10temp", True),
    ("cpu0_thermal", True), ("bigcore0-thermal", True),
    ("gpu-thermal", False), ("GPU-therm", False), ("cv1-thermal", False), ("PMIC-Die", False),
    ("Tboard_tegra", False), ("acpitz", False), ("iwlwifi_1", False), ("thermal-fan-est", False)])
def test_zone_names_the_cpu_is_known_by(tmp_path: Path, kind: str, cpu: bool) -> None:
    add_zone(tmp_path, 0, kind, 61_250)
    r = read_heat(tmp_path)
    assert r.zones == {kind: 61.25}
    assert r.cpu_celsius == (61.25 if cpu else None)


def test_an_x86_laptop_reads_its_package(tmp_path: Path) -> None:
    board(tmp_path, X86_ZONES, cpus=4, ceiling_khz=4_700_000)
    r = read_heat(tmp_path)
    assert r.cpu_celsius == 44.0
    assert r.ceiling_khz == {0: 4_700_000, 1: 4_700_000, 2: 4_700_000, 3: 4_700_000}
    assert r.cur_khz == {i: 729_600 for i in range(4)}


def test_millidegrees_become_degrees_and_the_hottest_of_two_same_named_zones_counts(tmp_path: Path) -> None:
    add_zone(tmp_path, 0, "cpu-thermal", 85_500)
    add_zone(tmp_path, 1, "cpu-thermal", 91_125)
    r = read_heat(tmp_path)
    assert r.zones == {"cpu-thermal": 85.5, "cpu-thermal:thermal_zone1": 91.125}
    assert r.cpu_celsius == 91.125


def test_unreadable_and_sentinel_zones_are_skipped(tmp_path: Path) -> None:
    add_zone(tmp_path, 0, "cpu-thermal", None)                        # no temp file
    (add_zone(tmp_path, 1, "CPU-therm", None) / "temp").mkdir()       # reading it fails (EISDIR)
    write(add_zone(tmp_path, 2, "soc0-thermal", None) / "temp", "n/a")   # not a number
    add_zone(tmp_path, 3, "soc1-thermal", -256_000)                   # a sensor that is off
    add_zone(tmp_path, 4, "soc2-thermal", 2_147_483_647)
    write(tmp_path / "class/thermal/thermal_zone5/temp", "99000")      # no type
    add_zone(tmp_path, 6, "gpu-thermal", 40_000)
    r = read_heat(tmp_path)
    assert r.zones == {"gpu-thermal": 40.0}
    assert r.cpu_celsius is None


def test_an_empty_or_missing_tree_reads_nothing(tmp_path: Path) -> None:
    assert read_heat(tmp_path / "absent") == HeatReading()
    (tmp_path / "devices/system/cpu/cpufreq/policy0").mkdir(parents=True)   # not a CPU
    (tmp_path / "devices/system/cpu/cpu1").mkdir(parents=True)               # offline: no cpufreq
    assert read_heat(tmp_path) == HeatReading()


def reading(celsius: float | None, ceilings: dict[int, int] | None = None) -> HeatReading:
    return HeatReading(cpu_celsius=celsius, ceiling_khz=ceilings or {})


def test_hysteresis_throttles_at_90_holds_at_80_and_clears_at_60() -> None:
    t = Throttle(throttle_c=85, resume_c=75)
    seen = []
    for c in (60, 90, 80, 86, 76, 60, 80, 84.9, 85):
        changed = t.update(reading(c))
        seen.append((c, t.throttled, changed))
    assert seen == [(60, False, False), (90, True, True), (80, True, False), (86, True, False), (76, True, False),
                    (60, False, True), (80, False, False), (84.9, False, False), (85, True, True)]


def test_the_reason_says_why_while_throttled_and_nothing_once_clear() -> None:
    t = Throttle(throttle_c=85, resume_c=75)
    t.update(reading(90.04))
    assert t.reason == "CPU at 90.0 C, at or above power.throttle_c 85 C"
    t.update(reading(80))
    assert t.reason == "CPU at 80.0 C, not yet below power.resume_c 75 C"
    t.update(reading(60))
    assert (t.throttled, t.reason) == (False, "")


def test_a_lost_zone_clears_the_throttle() -> None:
    t = Throttle()
    t.update(reading(95))
    assert t.update(reading(None)) and not t.throttled


def test_a_power_mode_below_the_rated_clock_is_no_cap_but_a_lowered_ceiling_is(tmp_path: Path) -> None:
    # An Orin in a 15 W mode: nvpmodel holds every ceiling below cpuinfo_max_freq from boot on.
    board(tmp_path, {"cpu-thermal": 50_000}, cpus=2, ceiling_khz=1_510_400)
    t = Throttle(throttle_c=85, resume_c=75)
    assert not t.update(read_heat(tmp_path)) and not t.throttled
    set_ceiling(tmp_path, 1, 1_113_600)        # the thermal governor caps cpu1
    assert t.update(read_heat(tmp_path)) and t.throttled
    assert t.capped == [1] and "on cpu 1" in t.reason
    set_ceiling(tmp_path, 1, 1_510_400)        # lifted, and the zone is cool
    assert t.update(read_heat(tmp_path)) and not t.throttled and t.capped == []


def test_a_higher_power_mode_at_run_time_is_no_cap(tmp_path: Path) -> None:
    add_cpu(tmp_path, 0, 1_510_400)
    t = Throttle()
    t.update(read_heat(tmp_path))
    set_ceiling(tmp_path, 0, 1_728_000)        # MAXN
    t.update(read_heat(tmp_path))
    assert not t.throttled and t.top_khz == {0: 1_728_000}


def test_a_cap_lifted_while_warm_holds_until_below_resume() -> None:
    t = Throttle(throttle_c=85, resume_c=75)
    t.update(reading(70, {0: 2_000_000}))
    assert t.update(reading(80, {0: 1_000_000})) and t.throttled      # capped at 80 C
    assert not t.update(reading(80, {0: 2_000_000})) and t.throttled  # uncapped, but not below 75 C
    assert t.update(reading(70, {0: 2_000_000})) and not t.throttled


def test_no_cpu_zone_and_no_clocks_never_throttle() -> None:
    t = Throttle()
    for _ in range(3):
        assert not t.update(HeatReading(zones={"gpu-thermal": 99.0})) and not t.throttled
