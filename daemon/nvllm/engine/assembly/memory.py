"""How much memory the engine may use: the memory available now, and the page pool it allows.

`available_memory()` is the host's available memory (psutil) capped by the cgroup the process runs
in, since under systemd (MemoryMax=, MemoryHigh=) or a container the kernel enforces the cgroup's
limit long before host memory runs out (nvllm/cgroup.py finds and reads the cgroup's files, and
counts the CPUs the same way). `size_pool()` turns one reading into a page count and says
how in one log line. The daemon's memory-pressure watchdog (server/board/memory_watchdog.py) polls the same reading.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from nvllm.cgroup import CGROUP_MOUNT, levels, own_cgroups, read_int, read_text

log = logging.getLogger(__name__)

MiB = 1 << 20
GiB = 1 << 30
# What the daemon holds besides the weights and the page pool once it is ready: the interpreter, NumPy
# and OpenBLAS, gRPC, the tokenizer and a few step-sized buffers. Measured (RSS after READY less weights
# and pool): 64 MiB with a tiny model, 95 MiB with SmolLM2-135M on x86_64 (figures and commands in
# docs/operating.md, "At rest, start-up and memory: measured"); tests/deploy/test_footprint.py holds the daemon to it.
RUNTIME_OVERHEAD_BYTES = 160 * MiB
# cgroup v1 reports "no limit" as a huge page-aligned number (0x7FFFFFFFFFFFF000 on 64-bit).
_V1_UNLIMITED = 1 << 60


def format_bytes(n: float) -> str:
    """'512 MiB' below a GiB, '3.10 GiB' from there; floors MiB so a figure never reads above a limit."""
    if abs(n) < GiB:
        return f"{math.floor(n / MiB)} MiB"
    return f"{n / GiB:.2f} GiB"


@dataclass(frozen=True)
class MemoryReading:
    available_bytes: int
    # Which bound gave the figure: "host (psutil)" or "cgroup v2 /system.slice/x (limit .., usage ..)".
    source: str


# ---------------------------------------------------------------------------------------------
# Reading available memory


def _read_stat(path: Path, *keys: str) -> int:
    """The first of keys found in a memory.stat file, else 0."""
    text = read_text(path)
    if not text:
        return 0
    values = dict(line.split(None, 1) for line in text.splitlines() if " " in line)
    for key in keys:
        if key in values:
            try:
                return int(values[key])
            except ValueError:
                return 0
    return 0


def _headroom(found: list[tuple[str, Path]], version: str) -> tuple[int, str] | None:
    """The smallest (limit - usage) over the levels that have a limit, and where it is."""
    best: tuple[int, str] | None = None
    for name, directory in found:
        if version == "v2":
            bounds = [read_int(directory / "memory.max"), read_int(directory / "memory.high")]
            limits = [b for b in bounds if b is not None]
            usage = read_int(directory / "memory.current") or 0
            # Inactive page cache is reclaimed before the limit bites (what kubelet calls the
            # working set): model files read once at start-up must not count as used for good.
            reclaimable = _read_stat(directory / "memory.stat", "inactive_file")
        else:
            raw = read_int(directory / "memory.limit_in_bytes")
            limits = [raw] if raw is not None and raw < _V1_UNLIMITED else []
            usage = read_int(directory / "memory.usage_in_bytes") or 0
            reclaimable = _read_stat(directory / "memory.stat", "total_inactive_file", "inactive_file")
        if not limits:
            continue
        limit = min(limits)
        used = max(0, usage - reclaimable)
        room = max(0, limit - used)
        if best is None or room < best[0]:
            where = (f"cgroup {version} {name} (limit {format_bytes(limit)}, "
                     f"usage {format_bytes(used)})")
            best = (room, where)
    return best


def cgroup_headroom(root: str | os.PathLike = "/") -> tuple[int, str] | None:
    """Bytes the daemon's cgroup (and its parents) still allow, and where the bound is; None
    when no cgroup limits memory. All paths are under root so tests can use a fake tree."""
    root = Path(root)
    v1, v2 = own_cgroups(root, "memory")
    if v1 is not None:
        return _headroom(levels(root / CGROUP_MOUNT / "memory", v1), "v1")
    if v2 is not None:
        return _headroom(levels(root / CGROUP_MOUNT, v2), "v2")
    return None


def available_memory(root: str | os.PathLike = "/",
                     host_available: int | None = None) -> MemoryReading:
    """Host available memory (psutil, unless given), capped by the cgroup's headroom."""
    host = psutil.virtual_memory().available if host_available is None else host_available
    bound = cgroup_headroom(root)
    if bound is not None and bound[0] < host:
        return MemoryReading(bound[0], bound[1])
    return MemoryReading(int(host), "host (psutil)")


# ---------------------------------------------------------------------------------------------
# Sizing the page pool


class PoolTooSmall(RuntimeError):
    """The pool cannot hold one sequence of max_model_len; the message says what to change."""


@dataclass(frozen=True)
class PoolSizing:
    num_blocks: int
    bytes_per_block: int
    block_size: int  # tokens per block
    available_bytes: int
    source: str
    reserve_bytes: int
    memory_fraction: float
    max_pool_bytes: int  # 0: no cap
    budget_bytes: int  # what the arithmetic allows the pool: min((available - reserve) * fraction, cap)
    overridden: bool  # num_blocks came from cache.num_blocks
    # What the settings can use at once, max_num_seqs x blocks per max_model_len sequence; 0: not given.
    demand_blocks: int = 0
    max_num_seqs: int = 0

    @property
    def bound(self) -> str:
        """Which bound decided num_blocks: "cache.num_blocks", "demand", "cap" or "memory"."""
        if self.overridden:
            return "cache.num_blocks"
        if 0 < self.demand_blocks and (self.bytes_per_block == 0   # pages that hold nothing (an encoder's)
                                       or self.demand_blocks <= self.budget_bytes // self.bytes_per_block):
            return "demand"
        usable = int(max(0, self.available_bytes - self.reserve_bytes) * self.memory_fraction)
        if 0 < self.max_pool_bytes < usable:
            return "cap"
        return "memory"

    @property
    def pool_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def arithmetic(self) -> str:
        """How the budget follows from the reading and the settings."""
        cap = format_bytes(self.max_pool_bytes) if self.max_pool_bytes > 0 else "none"
        usable = max(0, self.available_bytes - self.reserve_bytes)
        text = (f"available {format_bytes(self.available_bytes)} [{self.source}] - reserve "
                f"{format_bytes(self.reserve_bytes)} = {format_bytes(usable)} x fraction "
                f"{self.memory_fraction:g}, cap {cap} -> budget {format_bytes(self.budget_bytes)}")
        if self.demand_blocks > 0:
            per_seq = self.demand_blocks // self.max_num_seqs
            text += (f"; demand: max_num_seqs {self.max_num_seqs} x {per_seq} blocks per max_model_len "
                     f"sequence = {self.demand_blocks} blocks")
        return text

    def decided_by(self) -> str:
        """The bound that decided num_blocks, in words for the log line."""
        return {"cache.num_blocks": "set by cache.num_blocks",
                "demand": "decided by demand (scheduler.max_num_seqs x max_model_len)",
                "cap": "decided by the cap (cache.max_pool_mb)",
                "memory": "decided by memory (cache.memory_fraction of available less reserve)",
                }[self.bound]

    def log_line(self) -> str:
        """The whole sizing in one line, for the start-up log."""
        arithmetic = self.arithmetic()
        head = (f"KV page pool: {self.num_blocks} blocks x {self.block_size} tokens = "
                f"{self.num_tokens} tokens, {self.pool_bytes / GiB:.2f} GiB "
                f"({self.bytes_per_block} bytes per block)")
        if self.overridden:
            note = self.decided_by()
            if self.pool_bytes > self.budget_bytes:
                note += ", above the sizing budget"
            return f"{head}; {note}; the sizing would give: {arithmetic}"
        return f"{head}; {self.decided_by()}: {arithmetic}"


def pool_budget(available_bytes: int, memory_fraction: float, reserve_bytes: int,
                max_pool_bytes: int) -> int:
    """min((available - reserve) * fraction, max_pool if > 0), never negative."""
    budget = int(max(0, available_bytes - reserve_bytes) * memory_fraction)
    if max_pool_bytes > 0:
        budget = min(budget, max_pool_bytes)
    return budget


def size_pool(bytes_per_block: int, available_bytes: int, memory_fraction: float,
              reserve_bytes: int, max_pool_bytes: int, num_blocks_override: int | None,
              min_blocks_needed: int, *, block_size: int, source: str = "",
              max_model_len: int | None = None, max_num_seqs: int | None = None,
              held_blocks: int = 0, longest: Callable[[int], int] | None = None) -> PoolSizing:
    """Pages for the KV pool from one memory reading.

    min_blocks_needed: what one max_model_len sequence needs, ceil(max_model_len / block_size).
    max_model_len: only for the error message (defaults to min_blocks_needed * block_size).
    max_num_seqs: when given, the pool never exceeds what the settings can use at once,
    max_num_seqs x min_blocks_needed blocks (num_blocks_override still wins over everything).
    held_blocks: pages held for good (cache.pinned_prompts), on top of the demand and of what must fit.
    longest: the longest sequence so many pages hold, for the error message (None: pages x block_size;
    a pool of groups of layers differs, engine/assembly/model_info.py's ModelInfo.longest_in).
    Raises PoolTooSmall, naming the settings to change and the figures, when the pool is smaller.
    """
    if bytes_per_block <= 0 or block_size <= 0:
        raise ValueError(f"bytes_per_block and block_size must be positive, got {bytes_per_block}, {block_size}")
    if max_num_seqs is not None and max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be at least 1, got {max_num_seqs}")
    budget = pool_budget(available_bytes, memory_fraction, reserve_bytes, max_pool_bytes)
    demand = max_num_seqs * min_blocks_needed + held_blocks if max_num_seqs is not None else 0
    overridden = num_blocks_override is not None
    if num_blocks_override is not None:
        num_blocks = num_blocks_override
    else:
        # Pages past the demand would never be used: they only cost start-up time and memory.
        num_blocks = budget // bytes_per_block
        if demand > 0:
            num_blocks = min(num_blocks, demand)
    sizing = PoolSizing(
        num_blocks=num_blocks, bytes_per_block=bytes_per_block, block_size=block_size,
        available_bytes=available_bytes, source=source or "given", reserve_bytes=reserve_bytes,
        memory_fraction=memory_fraction, max_pool_bytes=max_pool_bytes, budget_bytes=budget,
        overridden=overridden, demand_blocks=demand, max_num_seqs=max_num_seqs or 0)
    if num_blocks < min_blocks_needed + held_blocks:
        raise PoolTooSmall(_too_small_message(sizing, min_blocks_needed,
                                              max_model_len or min_blocks_needed * block_size, held_blocks,
                                              longest or (lambda n: n * block_size)))
    return sizing


def _too_small_message(s: PoolSizing, min_blocks: int, max_model_len: int, held: int,
                       longest: Callable[[int], int]) -> str:
    need = (min_blocks + held) * s.bytes_per_block
    pinned = f" besides the {held} the pinned prompts hold (cache.pinned_prompts)" if held else ""
    head = (f"the KV page pool holds {s.num_blocks} blocks ({longest(s.num_blocks)} tokens of one sequence), but one "
            f"sequence of scheduler.max_model_len={max_model_len} needs {min_blocks} blocks of "
            f"{s.block_size} tokens{pinned} ({format_bytes(need)} at {s.bytes_per_block} bytes per block)")
    min_blocks += held
    fixes = []
    room = longest(s.num_blocks - held)   # what a sequence may use beside the pinned pages
    if room >= 2:  # the smallest max_model_len the settings accept
        fixes.append(f"lower scheduler.max_model_len to {room} or less")
    if s.overridden:
        fixes.append(f"raise cache.num_blocks to {min_blocks} or more")
        return f"{head}. To fix: {', or '.join(fixes)}."
    head += f"; sizing: {s.arithmetic()}"
    usable = s.available_bytes - s.reserve_bytes
    fraction_needed = need / usable if usable > 0 else math.inf
    capped = 0 < s.max_pool_bytes < need
    if capped:
        fixes.append(f"raise cache.max_pool_mb to {math.ceil(need / MiB)} or more (or 0 for no cap)")
    if s.memory_fraction < fraction_needed <= 0.95:
        fixes.append(f"raise cache.memory_fraction to {math.ceil(fraction_needed * 100) / 100:.2f} "
                      f"or more (it may be at most 0.95)")
    if s.reserve_bytes > 0:
        fixes.append(f"lower cache.reserve_mb (now {s.reserve_bytes // MiB})")
    if not capped:  # under the cap, more memory alone does not help
        needed_available = s.reserve_bytes + math.ceil(need / s.memory_fraction)
        fixes.append(f"free memory: with these settings {format_bytes(needed_available)} must be "
                     f"available, {format_bytes(s.available_bytes)} is")
    return f"{head}. To fix: {', or '.join(fixes)}."


def give_back_memory() -> None:
    """Collect what no one holds any more and hand freed heap pages back to the system: glibc keeps what is
    freed in its arenas (a tokenizer's parse, BLAS's threads' temporaries, an unloaded model's weights) until
    trimmed."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).malloc_trim   # glibc's; musl and others have none
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn
