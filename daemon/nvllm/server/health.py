"""The daemon's health, read once in a neutral form (`Health`, read by DaemonState.read_health) that each front
door shapes: gRPC's HealthResponse (grpc/health_reply.py) and HTTP's /health body (http/app.py).

Nothing here touches an array: numbers come from the engines' stats snapshots.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

# The states, as HTTP's /health says them; gRPC's HealthResponse.State names them STATE_<upper>.
STARTING, SERVING, NOT_ADMITTING, DRAINING = "starting", "serving", "not_admitting", "draining"


@dataclass(frozen=True)
class Health:
    """What the daemon reports of itself: its state (and why it does not admit), its default model's engine
    (`engine`: the stats snapshot, None while unloaded), every model served (DaemonState.model_status's
    rows), the memory plan and watchdog, and the board's heat."""
    state: str
    model: str
    version: str
    uptime_s: float
    startup_s: float
    not_admitting_reason: str = ""
    engine: dict[str, Any] | None = None
    models: list[dict[str, Any]] = field(default_factory=list)
    memory_budget_bytes: int = 0
    memory_held_bytes: int = 0
    watchdog_low_bytes: int = 0
    watchdog_high_bytes: int = 0
    available_memory_bytes: int | None = None       # the watchdog's last reading, once it has one
    thermal_throttled: bool = False
    throttle_reason: str = ""
    cpu_temperature_celsius: float | None = None    # None: no CPU zone read (or power.enabled off)


def process_start_time() -> float:
    """Wall-clock time the process started (for uptime and startup_s), to the kernel's tick.

    The age comes from the kernel's clocks (CLOCK_BOOTTIME less the start tick in /proc/self/stat);
    psutil's create_time adds the boot time, which /proc/stat gives in whole seconds, so it can be up
    to a second early. psutil is the fallback where /proc is not Linux's.
    """
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()     # fields 3.. (the name may hold spaces)
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(after_name[19]) / os.sysconf("SC_CLK_TCK")
        return time.time() - max(0.0, age)
    except (OSError, IndexError, ValueError, AttributeError):
        pass
    try:
        return psutil.Process().create_time()
    except psutil.Error:
        return time.time()
