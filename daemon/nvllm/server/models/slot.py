"""A served model's place in the daemon's ModelSet (model_set.py, which alone changes it): what may be served
under a name (`ModelSpec`), and its state: the phase, the engine serving and the leases on it, what it holds of
the memory budget, and an update's versions: the candidate loaded beside it and the engines it replaced that
still finish their requests (`Retiring`), with the last update's outcome (`UpdateRecord`, model_update.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from nvllm.config import Settings
from nvllm.engine.assembly.memory import format_bytes
from nvllm.engine.async_engine import AsyncEngine
from nvllm.server.models.file_signature import FileSignature

UNLOADED, LOADING, LOADED, UNLOADING = "unloaded", "loading", "loaded", "unloading"


@dataclass
class ModelSpec:
    """What may be served under a name: its settings (model.path and the per-model ones), its keep_alive
    in seconds (negative: never unloaded; 0: unloaded right after each request), pinned, and the other
    names clients may give it (a pulled model's: its Hub reference)."""
    name: str
    settings: Settings
    keep_alive_s: float = 300.0
    pinned: bool = False
    aliases: tuple[str, ...] = ()


@dataclass
class Retiring:
    """An engine an update replaced: it serves the leases it had (`leases`) and is unloaded after the last."""
    engine: AsyncEngine
    cost_bytes: int
    leases: int


@dataclass
class UpdateRecord:
    """A model's updates, for Health and the metrics: the last one's state ("" none yet; loading, checking,
    draining while under way; swapped, unchanged, deferred, failed), why it failed, and the count of each
    outcome since start."""
    state: str = ""
    error: str = ""
    outcomes: dict[str, int] = field(default_factory=dict)


class Slot:
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.phase = UNLOADED
        self.engine: AsyncEngine | None = None
        self.cost_bytes = 0              # what it holds of the budget: weights and pool (while loading: the least)
        self.keep_alive_s = spec.keep_alive_s
        self.leases = 0                  # requests between their lease and their end
        self.last_used = 0.0             # monotonic time of its last lease or release
        self.requests = 0                # leases taken since start
        self.loads = 0
        self.transition: asyncio.Future[None] | None = None   # the load or unload under way
        self.engine_leases = 0           # leases on `engine` (the rest of `leases` wait for it, or hold a retiring one)
        self.files: FileSignature = ()   # its files as they were when `engine` was loaded from them
        self.updating = False            # an update under way (model_update.py): not idle, not removed
        self.candidate: AsyncEngine | None = None   # an update's new engine, loaded beside `engine`, not yet swapped
        self.candidate_bytes = 0
        self.retiring: list[Retiring] = []           # engines an update replaced, finishing their requests
        self.update = UpdateRecord()

    @property
    def name(self) -> str:
        return self.spec.name

    def idle(self) -> bool:
        return self.phase == LOADED and self.leases == 0 and not self.updating and \
            (self.engine is None or self.engine.num_streams == 0)

    def held_bytes(self) -> int:
        """What it holds of the budget: its engine, an update's candidate, and the engines retiring."""
        return self.cost_bytes + self.candidate_bytes + sum(r.cost_bytes for r in self.retiring)

    def describe(self) -> str:
        running = self.engine.num_streams if self.engine is not None else 0
        return f"{self.name} ({format_bytes(self.cost_bytes)}, {self.phase}, {running} requests in flight)"
