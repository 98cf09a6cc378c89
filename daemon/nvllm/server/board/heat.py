"""The board's heat, read from sysfs, and whether the daemon should hold back because of it.

A drone's board throttles its clocks when hot, and the operator only sees answers slow down. Every few
seconds `read_heat` reads, under a root (/sys, or a tree a test lays out):

- class/thermal/thermal_zone*/type and temp (millidegrees Celsius): the CPU's zones by their type, as
  x86 kernels and Jetson's name them (x86_pkg_temp, coretemp, k10temp, cpu-thermal, CPU-therm,
  BCPU-therm, soc0-thermal, tj-thermal: Orin's junction, the hottest point of the chip);
- devices/system/cpu/cpu*/cpufreq/scaling_max_freq: each CPU's clock ceiling, which the kernel's thermal
  governor lowers when the chip is hot, whatever clock the CPU idles at now (scaling_cur_freq, reported
  but not judged: a quiet CPU clocks down by itself).

`Throttle` turns readings into a state with hysteresis: throttled at `throttle_c` on a CPU zone or while
any CPU is capped; clear again only below `resume_c` and uncapped, so it does not flap at the line.
A cap is a ceiling below the highest this CPU has had since the daemon started, not below its rated
maximum (cpuinfo_max_freq): a Jetson in a power mode other than MAXN (nvpmodel) holds every ceiling
below the rated one for good, and that is the operator's choice, not heat.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from nvllm.cgroup import read_int, read_text

# Zone types that measure the CPU (or the whole chip it shares a die with); the rest (gpu, cv, battery,
# wifi, board sensors, PMIC-Die, which some Jetsons pin at 100 C) do not say how hot the cores run.
CPU_ZONE = re.compile(r"cpu|x86_pkg_temp|coretemp|k10temp|zenpower|soc|tj-thermal|bigcore|littlecore",
                      re.IGNORECASE)
# A zone whose sensor is off reads a sentinel (-40 C, -256 C, 0x7fffffff...), never a temperature.
PLAUSIBLE_C = (-30.0, 150.0)
_NUMBERED = re.compile(r"\d+$")


@dataclass
class HeatReading:
    zones: dict[str, float] = field(default_factory=dict)   # every readable zone: "type" -> degrees Celsius
    cpu_celsius: float | None = None                          # the hottest CPU zone; None: no CPU zone
    ceiling_khz: dict[int, int] = field(default_factory=dict)  # each CPU's clock ceiling (scaling_max_freq)
    cur_khz: dict[int, int] = field(default_factory=dict)     # each CPU's clock now, for the log


def read_heat(root: Path | str = "/sys") -> HeatReading:
    """The thermal zones and CPU clocks under root; what is absent, unreadable or implausible is left out."""
    root = Path(root)
    reading = HeatReading()
    for zone in sorted(root.glob("class/thermal/thermal_zone*"), key=_number):
        kind, milli = read_text(zone / "type"), read_int(zone / "temp")
        if kind is None or milli is None or not PLAUSIBLE_C[0] <= milli / 1000.0 <= PLAUSIBLE_C[1]:
            continue
        name = kind if kind not in reading.zones else f"{kind}:{zone.name}"
        celsius = milli / 1000.0
        reading.zones[name] = celsius
        if CPU_ZONE.search(kind) and (reading.cpu_celsius is None or celsius > reading.cpu_celsius):
            reading.cpu_celsius = celsius
    for cpu in sorted(root.glob("devices/system/cpu/cpu[0-9]*"), key=_number):
        freq, index = cpu / "cpufreq", _number(cpu)
        ceiling, cur = read_int(freq / "scaling_max_freq"), read_int(freq / "scaling_cur_freq")
        if ceiling is not None and ceiling > 0:
            reading.ceiling_khz[index] = ceiling
        if cur is not None:
            reading.cur_khz[index] = cur
    return reading


def _number(path: Path) -> int:
    m = _NUMBERED.search(path.name)
    return int(m.group()) if m else -1


@dataclass
class Throttle:
    """Throttled from a reading at throttle_c (or a capped CPU) until one below resume_c, uncapped."""
    throttle_c: float = 85.0
    resume_c: float = 75.0
    throttled: bool = False
    reason: str = ""                                      # why, while throttled; "" when clear
    capped: list[int] = field(default_factory=list)       # CPUs whose ceiling is below their top, last reading
    top_khz: dict[int, int] = field(default_factory=dict)  # each CPU's highest ceiling seen: its power mode's

    def update(self, reading: HeatReading) -> bool:
        """Take a reading; True when the state changed (the caller logs it, once per change)."""
        for cpu, khz in reading.ceiling_khz.items():
            self.top_khz[cpu] = max(self.top_khz.get(cpu, 0), khz)
        self.capped = [cpu for cpu, khz in reading.ceiling_khz.items() if khz < self.top_khz[cpu]]
        t = reading.cpu_celsius
        hot = t is not None and t >= self.throttle_c
        cool = t is None or t < self.resume_c
        now = hot or bool(self.capped) or (self.throttled and not cool)
        if hot:
            self.reason = f"CPU at {t:.1f} C, at or above power.throttle_c {self.throttle_c:g} C"
        elif self.capped:
            cpus = ",".join(str(c) for c in self.capped)
            self.reason = f"CPU clock ceiling lowered (scaling_max_freq below its top since start) on cpu {cpus}"
        elif now:
            self.reason = f"CPU at {t:.1f} C, not yet below power.resume_c {self.resume_c:g} C"
        else:
            self.reason = ""
        changed = now != self.throttled
        self.throttled = now
        return changed
