"""The cgroup this process runs in: where its directories are, how to read their files, and the CPUs
it may use.

Under systemd (CPUQuota=, MemoryMax=) or in a container the kernel enforces the cgroup's limits, which
the host's figures do not show. engine/assembly/memory.py reads the memory limit through the helpers here;
`usable_cpus()` is the CPU side: the cores the affinity mask allows, capped by the CPU quota (cgroup v2
cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us) of the cgroup and every parent. Every path is taken
under a root, so tests can lay out a fake /proc and /sys tree.

This module sits at the shared bottom (like config.py): the model's thread count and the engine's
memory reading both come from it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

CGROUP_MOUNT = "sys/fs/cgroup"


def read_text(path: Path) -> str | None:
    """A cgroup file's text, stripped; None when it is absent or unreadable."""
    try:
        return path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None
    except OSError:  # e.g. EINVAL from a half-torn-down cgroup
        return None


def read_int(path: Path) -> int | None:
    """An integer file; None when absent, "max" or unparsable."""
    text = read_text(path)
    if text is None or text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def own_cgroups(root: Path, controller: str) -> tuple[str | None, str | None]:
    """(the v1 cgroup path of `controller`, the v2 cgroup path) from /proc/self/cgroup; either may be
    None. A v1 line naming the controller wins over the v2 line in hybrid setups, because a controller
    can be bound to one hierarchy only."""
    text = read_text(root / "proc/self/cgroup")
    v1 = v2 = None
    for line in (text or "").splitlines():
        parts = line.split(":", 2)  # hierarchy-id:controllers:path
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif controller in controllers.split(","):
            v1 = path
    return v1, v2


def levels(base: Path, cgroup_path: str) -> list[tuple[str, Path]]:
    """The cgroup's directory and each parent up to the mount point, leaf first, as (name, dir).

    Limits set on a parent slice bind its children, so every level counts. Levels missing from
    the mount (a container that sees only its own subtree) are skipped; the mount point itself,
    which then is the container's cgroup, always counts.
    """
    normal = os.path.normpath("/" + cgroup_path.strip().lstrip("/"))  # "/../x" -> "/x"
    parts = PurePosixPath(normal).parts[1:]  # drop the leading "/"
    found = []
    for i in range(len(parts), -1, -1):
        directory = base.joinpath(*parts[:i])
        if directory.is_dir():
            found.append(("/" + "/".join(parts[:i]), directory))
    return found


# ---------------------------------------------------------------------------------------------
# CPUs


@dataclass(frozen=True)
class CpuCount:
    count: int     # whole cores this process may keep busy, at least 1
    source: str    # how: "affinity 4 cores" or "cgroup v2 /x quota 1.50 CPUs (affinity 4 cores)"


def _quota(directory: Path, version: str) -> float | None:
    """The CPUs one cgroup level allows (quota / period), or None when it sets no quota."""
    quota: int | None
    period: int | None
    if version == "v2":
        fields = (read_text(directory / "cpu.max") or "").split()   # "quota period" or "max period"
        if len(fields) != 2 or fields[0] == "max":
            return None
        try:
            quota, period = int(fields[0]), int(fields[1])
        except ValueError:
            return None
    else:
        quota, period = read_int(directory / "cpu.cfs_quota_us"), read_int(directory / "cpu.cfs_period_us")
        if quota is None or period is None:
            return None
    if quota <= 0 or period <= 0:   # v1 writes -1 for "no quota"
        return None
    return quota / period


def _v1_cpu_mount(root: Path) -> Path:
    """Where the v1 cpu controller is mounted: cpu (often a link to cpu,cpuacct), else cpu,cpuacct."""
    for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        if (root / CGROUP_MOUNT / name).is_dir():
            return root / CGROUP_MOUNT / name
    return root / CGROUP_MOUNT / "cpu"


def cpu_quota(root: str | os.PathLike = "/") -> tuple[float, str] | None:
    """The smallest CPU quota over the cgroup and its parents, in CPUs, and where it is; None when no
    level sets one."""
    root = Path(root)
    v1, v2 = own_cgroups(root, "cpu")
    if v1 is not None:
        found, version = levels(_v1_cpu_mount(root), v1), "v1"
    elif v2 is not None:
        found, version = levels(root / CGROUP_MOUNT, v2), "v2"
    else:
        return None
    best: tuple[float, str] | None = None
    for name, directory in found:
        cpus = _quota(directory, version)
        if cpus is not None and (best is None or cpus < best[0]):
            best = (cpus, f"cgroup {version} {name}")
    return best


def whole_cpus(quota: float) -> int:
    """A quota in CPUs as a thread count: rounded to the nearest whole core, at least 1.

    A thread whose share of its core is a little short (1.5 CPUs -> 2) costs less than a core left
    idle; a sliver over a whole count (2.2 -> 2) buys no thread, since the matmul threads wait for the
    slowest and an extra one would be throttled for most of each period."""
    return max(1, math.floor(quota + 0.5))


def usable_cpus(root: str | os.PathLike = "/", affinity: int | None = None) -> CpuCount:
    """The cores this process may use: the affinity mask's (os.sched_getaffinity, or `affinity` when
    given), capped by the cgroup's CPU quota rounded by whole_cpus()."""
    if affinity is None:
        affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    affinity = max(1, affinity)
    where = f"affinity {affinity} core{'s' if affinity != 1 else ''}"
    bound = cpu_quota(root)
    if bound is not None and whole_cpus(bound[0]) < affinity:
        return CpuCount(whole_cpus(bound[0]), f"{bound[1]} quota {bound[0]:.2f} CPUs ({where})")
    return CpuCount(affinity, where)
