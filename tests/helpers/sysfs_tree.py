"""A made /sys for the heat tests: thermal zones and CPU clocks laid out as the kernel shows them, each file
replaced whole when it changes (as a reader must never see one half-written)."""
from __future__ import annotations

import os
from pathlib import Path

# Zone types as an Orin's kernel names them (JetPack 6), and an x86 laptop's.
ORIN_ZONES = {"cpu-thermal": 48_500, "gpu-thermal": 47_000, "cv0-thermal": 46_000, "soc0-thermal": 47_500,
              "soc1-thermal": 47_200, "tj-thermal": 49_000}
X86_ZONES = {"acpitz": 27_800, "INT3400 Thermal": 20_000, "x86_pkg_temp": 44_000, "iwlwifi_1": 38_000}


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(text + "\n")
    os.replace(part, path)


def add_zone(root: Path, index: int, kind: str, milli: int | None) -> Path:
    """thermal_zone<index> of that type; milli None: no temp file."""
    zone = root / "class/thermal" / f"thermal_zone{index}"
    write(zone / "type", kind)
    if milli is not None:
        set_temp(zone, milli)
    return zone


def set_temp(zone: Path, milli: int) -> None:
    write(zone / "temp", str(milli))


def add_cpu(root: Path, index: int, ceiling_khz: int, rated_khz: int = 1_728_000, cur_khz: int = 729_600) -> Path:
    freq = root / "devices/system/cpu" / f"cpu{index}" / "cpufreq"
    write(freq / "cpuinfo_max_freq", str(rated_khz))
    set_ceiling(root, index, ceiling_khz)
    write(freq / "scaling_cur_freq", str(cur_khz))
    return freq


def set_ceiling(root: Path, index: int, khz: int) -> None:
    write(root / "devices/system/cpu" / f"cpu{index}" / "cpufreq" / "scaling_max_freq", str(khz))


def board(root: Path, zones: dict[str, int], cpus: int = 2, ceiling_khz: int = 1_728_000) -> dict[str, Path]:
    """A board of those zones (type -> millidegrees) and CPUs at that ceiling; type -> its zone's folder."""
    made = {kind: add_zone(root, i, kind, milli) for i, (kind, milli) in enumerate(zones.items())}
    for i in range(cpus):
        add_cpu(root, i, ceiling_khz)
    return made
