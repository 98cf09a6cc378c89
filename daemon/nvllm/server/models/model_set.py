"""The models a daemon serves, by name, in one memory plan.

Each model is a `Slot`: unloaded, loading, loaded (its own AsyncEngine and engine thread) or unloading.
A request leases its model (`ModelSet.lease`), which loads it first when it is not loaded; the lease is
given back when the request ends (DaemonState's Submission does it). The memory plan is one budget,
fixed at start: a model costs its weights and its page pool, and is loaded only when the budget holds
it beside what is loaded; idle models (no lease, no request in flight) are unloaded least recently used
first to make room, and when that is not enough the request is refused (`Refused`, no_room) naming the
budget and what holds it; nothing running is touched. A pinned model is loaded at start and never
unloaded. keep_alive (Ollama's): a model idle that long is unloaded by `reap`, which the daemon calls
every second; 0 unloads it right after its last request, a negative one never; a request's own
keep_alive becomes its model's from then on.

The set changes while the daemon runs: `add` serves a model pulled through the daemon (Ollama's /api/pull)
under its name and aliases, `remove` stops serving one (/api/delete; never the default, a pinned one or one
with requests in flight: `ModelBusy`). A name resolves by its served name or an alias, either with Ollama's
":latest" added or taken off (its clients add it to a name without a tag).

How a model is loaded and unloaded, and what the least is that it needs, are the daemon's (model_loader.py):
this module only decides when, and keeps the accounts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nvllm.config import Settings
from nvllm.engine.assembly.memory import format_bytes
from nvllm.engine.async_engine import AsyncEngine

log = logging.getLogger("nvllm.server.models")

UNLOADED, LOADING, LOADED, UNLOADING = "unloaded", "loading", "loaded", "unloading"


class UnknownModel(Exception):
    """A request's model that this daemon does not serve (HTTP 404, gRPC NOT_FOUND)."""

    def __init__(self, name: str, choices: list[str]) -> None:
        super().__init__(f"the model {name[:64]!r} does not exist; this daemon serves "
                         f"{', '.join(repr(c) for c in choices)}")
        self.name = name
        self.choices = choices


class ModelBusy(Exception):
    """A model that cannot be removed now: the default one, a pinned one, or one with requests in flight
    (`in_flight`)."""

    def __init__(self, message: str, in_flight: bool = False) -> None:
        super().__init__(message)
        self.in_flight = in_flight


LATEST = ":latest"    # Ollama's default tag, which its clients add to a name without one


class NoRoom(Exception):
    """A model that the memory budget cannot hold even with every idle model unloaded."""


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

    @property
    def name(self) -> str:
        return self.spec.name

    def idle(self) -> bool:
        return self.phase == LOADED and self.leases == 0 and (self.engine is None or self.engine.num_streams == 0)

    def describe(self) -> str:
        running = self.engine.num_streams if self.engine is not None else 0
        return f"{self.name} ({format_bytes(self.cost_bytes)}, {self.phase}, {running} requests in flight)"


class Lease:
    """A request's hold on its loaded model; release() (once) hands it back."""

    def __init__(self, models: ModelSet, slot: Slot) -> None:
        self.models = models
        self.slot = slot
        self.released = False
        assert slot.engine is not None
        self.engine: AsyncEngine = slot.engine

    @property
    def name(self) -> str:
        return self.slot.name

    @property
    def max_num_seqs(self) -> int:
        return self.slot.spec.settings.scheduler.max_num_seqs

    def release(self, keep_alive_s: float | None = None) -> None:
        if self.released:
            return
        self.released = True
        self.models.release(self.slot, keep_alive_s)


# (spec, bytes of the budget free for it) -> (its engine, started; the bytes it holds)
Loader = Callable[[ModelSpec, int], Awaitable[tuple[AsyncEngine, int]]]
Unloader = Callable[[AsyncEngine], Awaitable[None]]   # stops it; its memory goes once unreferenced
Reclaimer = Callable[[], Awaitable[None]]             # then hands freed memory back to the system


class ModelSet:
    def __init__(self, specs: list[ModelSpec], default: str, budget_bytes: int, load: Loader, unload: Unloader,
                 least: Callable[[ModelSpec], int], reclaim: Reclaimer | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """least(spec): the fewest bytes the model can be served in (its weights and one max_model_len
        sequence's pages), read from its files before loading it."""
        self.slots = {s.name: Slot(s) for s in specs}
        self.aliases: dict[str, str] = {}     # another name a client may use -> the served name
        for spec in specs:
            self.aliases.update({a: spec.name for a in spec.aliases if a not in self.slots})
        if default not in self.slots:
            raise ValueError(f"the default model {default!r} is not among {list(self.slots)}")
        self.default = default
        self.budget_bytes = budget_bytes
        self._load, self._unload, self._least, self._reclaim, self._clock = load, unload, least, reclaim, clock

    @classmethod
    def serving(cls, name: str, engine: AsyncEngine, max_num_seqs: int) -> ModelSet:
        """One model, loaded already and kept (the offline harnesses' and the tests' daemon state)."""
        settings = Settings()
        settings.scheduler.max_num_seqs = max_num_seqs
        models = cls([ModelSpec(name, settings, -1.0, pinned=True)], name, 0, _cannot_load, _cannot_unload,
                     lambda spec: 0)
        slot = models.slots[name]
        slot.engine, slot.phase = engine, LOADED
        return models

    # -- queries ----------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self.slots)

    def resolve(self, name: str | None) -> Slot:
        """The slot a request's model field names: empty or None is the default model; a served name or an
        alias, as given, or with ":latest" taken off or added."""
        if not name:
            return self.slots[self.default]
        tried = [name, name[:-len(LATEST)]] if name.endswith(LATEST) else [name, name + LATEST]
        for n in tried:
            slot = self.slots.get(n) or self.slots.get(self.aliases.get(n, ""))
            if slot is not None:
                return slot
        raise UnknownModel(name, self.names)

    def aliases_of(self, name: str) -> list[str]:
        return [a for a, n in self.aliases.items() if n == name]

    # -- changes while serving ------------------------------------------------------------------
    def add(self, spec: ModelSpec, aliases: list[str] | tuple[str, ...] = ()) -> Slot:
        """Serve spec under its name (unloaded: loaded on its first lease, within the budget) and its
        aliases; ValueError for a name or an alias another model answers to."""
        aliases = [a for a in dict.fromkeys([*spec.aliases, *aliases]) if a != spec.name]
        for n in (spec.name, *aliases):
            if n in self.slots or n in self.aliases:
                owner = self.aliases.get(n, n)
                raise ValueError(f"a model named {spec.name!r} is served already" if n == spec.name == owner
                                 else f"the name {n!r} is taken by the model {owner!r}")
        slot = self.slots[spec.name] = Slot(spec)
        self.aliases.update({a: spec.name for a in aliases})
        return slot

    async def remove(self, name: str) -> ModelSpec:
        """Stop serving the named model (unloading it if loaded) and forget its aliases; UnknownModel, or
        ModelBusy for the default model, a pinned one, or one with requests in flight."""
        slot = self.resolve(name)
        if slot.name == self.default:
            raise ModelBusy(f"the model {slot.name!r} is this daemon's default model (server.default_model)")
        if slot.spec.pinned:
            raise ModelBusy(f"the model {slot.name!r} is pinned (kept loaded for good)")
        while slot.transition is not None:       # a load or an unload under way: let it end first
            await asyncio.shield(slot.transition)
        running = slot.engine.num_streams if slot.engine is not None else 0
        if slot.leases or running:
            raise ModelBusy(f"the model {slot.name!r} has {max(slot.leases, running)} requests in flight",
                            in_flight=True)
        del self.slots[slot.name]                # no new lease finds it from here
        self.aliases = {a: n for a, n in self.aliases.items() if n != slot.name}
        await self.unload(slot)
        return slot.spec

    def expires_in(self, slot: Slot) -> float | None:
        """Seconds until reap unloads the slot if it stays idle (None: never: pinned, or keep_alive < 0)."""
        if slot.spec.pinned or slot.keep_alive_s < 0:
            return None
        if not slot.idle():
            return slot.keep_alive_s
        return max(0.0, slot.keep_alive_s - (self._clock() - slot.last_used))

    def used_bytes(self) -> int:
        return sum(s.cost_bytes for s in self.slots.values())

    def loaded(self) -> list[Slot]:
        return [s for s in self.slots.values() if s.phase == LOADED]

    def engines(self) -> list[AsyncEngine]:
        return [s.engine for s in self.slots.values() if s.engine is not None]

    # -- leases -------------------------------------------------------------------------------------
    async def lease(self, name: str | None, request: bool = True) -> Lease:
        """The named model, loaded (waiting for its load, or loading it, first); UnknownModel, NoRoom, or
        the load's own failure (EngineBuildError) otherwise. request false: the daemon's own (at start),
        not counted as a request."""
        slot = self.resolve(name)
        slot.leases += 1              # from here it is not idle: nothing unloads it under the request
        try:
            while slot.phase != LOADED:
                if slot.transition is None:
                    slot.transition = asyncio.ensure_future(self._load_slot(slot))
                await asyncio.shield(slot.transition)
        except BaseException:
            self.release(slot, None)
            raise
        slot.requests += request
        slot.last_used = self._clock()
        return Lease(self, slot)

    def release(self, slot: Slot, keep_alive_s: float | None) -> None:
        slot.leases -= 1
        slot.last_used = self._clock()
        if keep_alive_s is not None and not slot.spec.pinned:
            slot.keep_alive_s = keep_alive_s

    # -- loading and unloading --------------------------------------------------------------------------
    async def _load_slot(self, slot: Slot) -> None:
        try:
            need = self._least(slot.spec)
            await self._make_room(slot, need)
            slot.phase, slot.cost_bytes = LOADING, need     # held while it loads, so no other load takes it
            free = self.budget_bytes - self.used_bytes() + need
            log.info("loading model %s (%s of the memory budget free)", slot.name, format_bytes(free))
            engine, cost = await self._load(slot.spec, free)
            slot.engine, slot.cost_bytes, slot.phase = engine, cost, LOADED
            slot.loads += 1
            slot.last_used = self._clock()
            log.info("model %s loaded: %s of the budget's %s now held", slot.name, format_bytes(self.used_bytes()),
                     format_bytes(self.budget_bytes))
        except BaseException:
            slot.phase, slot.cost_bytes, slot.engine = UNLOADED, 0, None
            raise
        finally:
            slot.transition = None

    async def _make_room(self, slot: Slot, need: int) -> None:
        """Unload idle models, least recently used first, until need bytes are free; NoRoom if they never are."""
        while self.budget_bytes - self.used_bytes() < need:
            idle = [s for s in self.slots.values() if s is not slot and s.idle() and not s.spec.pinned]
            if not idle:
                held = "; ".join(s.describe() for s in self.slots.values() if s.cost_bytes) or "nothing"
                free = self.budget_bytes - self.used_bytes()
                raise NoRoom(f"the model {slot.name!r} needs at least {format_bytes(need)} and the memory budget "
                             f"of {format_bytes(self.budget_bytes)} has {format_bytes(free)} free; held: {held}")
            victim = min(idle, key=lambda s: s.last_used)
            log.info("unloading model %s (idle, least recently used) to make room for %s", victim.name, slot.name)
            await self.unload(victim)

    async def unload(self, slot: Slot) -> None:
        """Stop the slot's engine and give its memory back; what it ran ends with "abort" (callers unload
        idle slots only, but the drain unloads every one)."""
        if slot.phase != LOADED or slot.engine is None:
            return
        engine, slot.engine = slot.engine, None
        slot.phase = UNLOADING
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        slot.transition = done
        try:
            await self._unload(engine)
            del engine                      # the last reference here: the weights and pool can go
            if self._reclaim is not None:
                await self._reclaim()
        finally:
            slot.cost_bytes, slot.phase, slot.transition = 0, UNLOADED, None
            done.set_result(None)
        log.info("model %s unloaded: %s of the budget held", slot.name, format_bytes(self.used_bytes()))

    async def reap(self) -> None:
        """Unload every idle model whose keep_alive has passed (pinned ones and negative keep_alive never)."""
        now = self._clock()
        for slot in list(self.slots.values()):
            if slot.spec.pinned or slot.keep_alive_s < 0 or not slot.idle():
                continue
            if now - slot.last_used >= slot.keep_alive_s:
                log.info("model %s idle for %.0f s (keep_alive %g s): unloading", slot.name, now - slot.last_used,
                         slot.keep_alive_s)
                await self.unload(slot)

    def status(self) -> list[dict[str, Any]]:
        """Each model's state, for Health, /v1/models and the metrics."""
        out = []
        for s in self.slots.values():
            stats = s.engine.stats() if s.engine is not None else None
            out.append({"name": s.name, "state": s.phase, "pinned": s.spec.pinned, "keep_alive_s": s.keep_alive_s,
                        "bytes": s.cost_bytes, "requests": s.requests, "loads": s.loads, "stats": stats,
                        "default": s.name == self.default})
        return out


async def _cannot_load(spec: ModelSpec, free: int) -> tuple[AsyncEngine, int]:
    raise RuntimeError(f"{spec.name} is served as it was given: it is never loaded again")


async def _cannot_unload(engine: AsyncEngine) -> None:
    raise RuntimeError("a model served as it was given is never unloaded")
