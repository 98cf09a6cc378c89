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

A new version of a model (model_update.py decides how) loads beside the old one as its slot's `candidate`,
then is `swap`ped in: the old engine retires, serving the leases it holds (each lease knows its engine) and
unloaded after the last; or, when both do not fit, `reload_in_place` drains the old one first.

How a model is loaded and unloaded, and what the least is that it needs, are the daemon's (model_loader.py):
this module only decides when, and keeps the accounts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nvllm.config import Settings
from nvllm.engine.assembly.memory import format_bytes
from nvllm.engine.async_engine import AsyncEngine
from nvllm.server.models.file_signature import FileSignature, file_signature
from nvllm.server.models.slot import LOADED, LOADING, UNLOADED, UNLOADING, ModelSpec, Retiring, Slot

log = logging.getLogger("nvllm.server.models")



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
        self.models.release(self.slot, keep_alive_s, self.engine)


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
        self._retirements: set[asyncio.Task[None]] = set()

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
        if slot.updating:
            raise ModelBusy(f"the model {slot.name!r} is being updated", in_flight=True)
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
        return sum(s.held_bytes() for s in self.slots.values())

    def loaded(self) -> list[Slot]:
        return [s for s in self.slots.values() if s.phase == LOADED]

    def engines(self) -> list[AsyncEngine]:
        """Every engine running: each slot's, an update's candidate, those retiring."""
        out = []
        for s in self.slots.values():
            out += [e for e in (s.engine, s.candidate) if e is not None] + [r.engine for r in s.retiring]
        return out

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
        slot.engine_leases += 1
        return Lease(self, slot)

    def release(self, slot: Slot, keep_alive_s: float | None, engine: AsyncEngine | None = None) -> None:
        """A lease given back (engine: the one it held; None: one that never got an engine)."""
        slot.leases -= 1
        slot.last_used = self._clock()
        if keep_alive_s is not None and not slot.spec.pinned:
            slot.keep_alive_s = keep_alive_s
        if engine is None:
            return
        if engine is slot.engine:
            slot.engine_leases -= 1
            return
        for r in slot.retiring:
            if r.engine is engine:
                r.leases -= 1
                if r.leases == 0:
                    self._retire(slot, r)
                return

    # -- loading and unloading --------------------------------------------------------------------------
    async def _load_slot(self, slot: Slot) -> None:
        try:
            need = self._least(slot.spec)
            await self._make_room(slot, need)
            slot.phase, slot.cost_bytes = LOADING, need     # held while it loads, so no other load takes it
            free = self.budget_bytes - self.used_bytes() + need
            log.info("loading model %s (%s of the memory budget free)", slot.name, format_bytes(free))
            files = file_signature(slot.spec.settings.model_path())
            engine, cost = await self._load(slot.spec, free)
            slot.engine, slot.cost_bytes, slot.phase, slot.files = engine, cost, LOADED, files
            slot.engine_leases = 0
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
        held, slot.engine = [slot.engine], None
        slot.phase = UNLOADING
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        slot.transition = done
        try:
            await self._stop(held)
        finally:
            slot.cost_bytes, slot.phase, slot.transition = 0, UNLOADED, None
            done.set_result(None)
        log.info("model %s unloaded: %s of the budget held", slot.name, format_bytes(self.used_bytes()))

    # -- updates in place (model_update.py decides which way) --------------------------------------
    def least(self, spec: ModelSpec) -> int:
        """The fewest bytes the model can be served in, read from its files as they are now."""
        return self._least(spec)

    def room_for(self, slot: Slot) -> int:
        """The bytes a new version of slot's model could have beside it (idle models unloaded)."""
        idle = sum(s.held_bytes() for s in self.slots.values() if s is not slot and s.idle() and not s.spec.pinned)
        return self.budget_bytes - self.used_bytes() + idle

    async def load_beside(self, slot: Slot, need: int) -> AsyncEngine:
        """Slot's model loaded again beside the one serving, as its candidate; NoRoom, or the load's failure."""
        await self._make_room(slot, need)
        slot.candidate_bytes = need          # held while it loads, so no other load takes it
        free = self.budget_bytes - self.used_bytes() + need
        log.info("model %s: loading its new version beside the one serving (%s of the memory budget free)",
                 slot.name, format_bytes(free))
        try:
            engine, cost = await self._load(slot.spec, free)
        except BaseException:
            slot.candidate_bytes = 0
            raise
        slot.candidate, slot.candidate_bytes = engine, cost
        return engine

    async def discard_candidate(self, slot: Slot) -> None:
        """The candidate stopped and its memory given back (an update that failed its check)."""
        held = [slot.candidate] if slot.candidate is not None else []
        slot.candidate = None
        try:
            await self._stop(held)
        finally:
            slot.candidate_bytes = 0

    async def _stop(self, held: list[AsyncEngine]) -> None:
        """Stop the engine in held (the caller's one reference, taken from it) and give its memory back."""
        if held:
            engine = held.pop()
            await self._unload(engine)
            del engine                      # the last reference here: the weights and pool can go
            if self._reclaim is not None:
                await self._reclaim()

    def swap(self, slot: Slot, files: FileSignature) -> None:
        """The candidate takes the slot: new leases get it; the old engine retires, unloaded once the last
        lease it has is given back (at once when it has none)."""
        assert slot.candidate is not None
        old, old_cost = slot.engine, slot.cost_bytes
        slot.engine, slot.cost_bytes = slot.candidate, slot.candidate_bytes
        slot.candidate, slot.candidate_bytes = None, 0
        slot.files, slot.loads = files, slot.loads + 1
        if old is None:
            slot.engine_leases, slot.phase = 0, LOADED
            return
        r = Retiring(old, old_cost, slot.engine_leases)
        slot.engine_leases = 0
        slot.retiring.append(r)
        log.info("model %s: new version swapped in; the old one finishes its %d requests", slot.name, r.leases)
        if r.leases == 0:
            self._retire(slot, r)

    def _retire(self, slot: Slot, r: Retiring) -> None:
        task = asyncio.ensure_future(self._unload_retired(slot, r))
        self._retirements.add(task)
        task.add_done_callback(self._retirements.discard)

    async def _unload_retired(self, slot: Slot, r: Retiring) -> None:
        try:      # (its last leases are back: what their streams left unfinished ends with "abort")
            await self._unload(r.engine)
        except Exception:
            log.exception("model %s: unloading the version it replaced failed", slot.name)
        finally:
            slot.retiring = [x for x in slot.retiring if x is not r]
        del r                               # the last reference here: its weights and pool can go
        if self._reclaim is not None:
            await self._reclaim()
        log.info("model %s: old version unloaded: %s of the budget held", slot.name, format_bytes(self.used_bytes()))

    async def retired(self) -> None:
        """Wait for every retiring engine whose leases are all back to be unloaded (the tests' and the drain's)."""
        while self._retirements:
            await asyncio.gather(*list(self._retirements), return_exceptions=True)

    async def reload_in_place(self, slot: Slot, check: Callable[[AsyncEngine], Awaitable[None]],
                              drain_s: float) -> None:
        """New leases wait while the running ones finish (drain_s at most: TimeoutError, the old one serving
        on), the old engine is unloaded, the files loaded again and checked; a failure leaves it unloaded."""
        engine = slot.engine
        assert engine is not None and slot.phase == LOADED and slot.transition is None
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        slot.transition, slot.phase = done, UNLOADING      # from here new leases wait for `done`
        try:
            deadline = self._clock() + drain_s
            while (slot.engine_leases or engine.num_streams) and self._clock() < deadline:
                await asyncio.sleep(0.02)
            if slot.engine_leases or engine.num_streams:
                slot.phase = LOADED
                raise TimeoutError(f"{max(slot.engine_leases, engine.num_streams)} requests still running after "
                                   f"{drain_s:g} s (server.update_drain_s)")
            slot.engine, held = None, [engine]
            del engine
            await self._stop(held)
            slot.cost_bytes, slot.phase = 0, UNLOADED
            need = self._least(slot.spec)
            await self._make_room(slot, need)
            slot.phase, slot.cost_bytes = LOADING, need
            free = self.budget_bytes - self.used_bytes() + need
            files = file_signature(slot.spec.settings.model_path())
            new, cost = await self._load(slot.spec, free)
            try:
                await check(new)
            except BaseException:
                await self._unload(new)
                raise
            slot.engine, slot.cost_bytes, slot.files, slot.engine_leases = new, cost, files, 0
            slot.phase, slot.loads = LOADED, slot.loads + 1
            slot.last_used = self._clock()
        except BaseException:
            if slot.engine is None:
                slot.phase, slot.cost_bytes = UNLOADED, 0
            raise
        finally:
            slot.transition = None
            done.set_result(None)

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
                        "bytes": s.held_bytes(), "requests": s.requests, "loads": s.loads, "stats": stats,
                        "default": s.name == self.default, "retiring": len(s.retiring),
                        "update_state": s.update.state, "update_error": s.update.error,
                        "updates": dict(s.update.outcomes)})
        return out


async def _cannot_load(spec: ModelSpec, free: int) -> tuple[AsyncEngine, int]:
    raise RuntimeError(f"{spec.name} is served as it was given: it is never loaded again")


async def _cannot_unload(engine: AsyncEngine) -> None:
    raise RuntimeError("a model served as it was given is never unloaded")
