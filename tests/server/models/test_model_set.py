"""The memory plan's decisions (server/models/model_set.py) with stand-in engines: a model loads on its first lease,
once however many wait for it; an unknown name is refused naming the choices; when the budget does not
hold a model beside the others, idle ones go least recently used first, pinned ones never, busy ones never,
and with no room left the refusal names the budget and what holds it; keep_alive unloads an idle model,
0 at once and a negative one never; a request's keep_alive becomes its model's; a failed load leaves
nothing held."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from nvllm.config import Settings
from nvllm.server.models.model_set import LOADED, UNLOADED, ModelSet, ModelSpec, NoRoom, UnknownModel

MB = 1 << 20


class FakeEngine:
    def __init__(self, name: str) -> None:
        self.name = name
        self.num_streams = 0
        self.stopped = False

    def stats(self) -> dict[str, Any]:
        return {"running": self.num_streams, "waiting": 0}


class Harness:
    """A ModelSet whose models cost `costs[name]` MB, loads counted, on a clock the test moves."""

    def __init__(self, costs: dict[str, int], budget_mb: int, pinned: tuple[str, ...] = (),
                 keep_alive: float = 300.0, fail: tuple[str, ...] = ()) -> None:
        self.costs, self.fail = costs, fail
        self.loads: list[str] = []
        self.unloads: list[str] = []
        self.now = 0.0
        specs = [ModelSpec(n, Settings(), keep_alive, n in pinned) for n in costs]
        self.models = ModelSet(specs, next(iter(costs)), budget_mb * MB, self.load, self.unload,
                               lambda spec: self.costs[spec.name] * MB, clock=lambda: self.now)

    async def load(self, spec: ModelSpec, free: int) -> tuple[Any, int]:
        await asyncio.sleep(0.01)
        if spec.name in self.fail:
            raise RuntimeError(f"{spec.name}: a damaged file")
        self.loads.append(spec.name)
        return FakeEngine(spec.name), self.costs[spec.name] * MB

    async def unload(self, engine: Any) -> None:
        engine.stopped = True
        self.unloads.append(engine.name)

    def phases(self) -> dict[str, str]:
        return {n: s.phase for n, s in self.models.slots.items()}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_model_loads_on_first_use_once_however_many_wait() -> None:
    h = Harness({"chat": 100, "embed": 50}, 1000)

    async def go() -> list[Any]:
        leases = await asyncio.gather(*[h.models.lease("embed") for _ in range(5)])
        engines = {id(lease.engine) for lease in leases}
        for lease in leases:
            lease.release()
            lease.release()          # once only
        return [engines, h.models.slots["embed"].leases]

    engines, leases = run(go())
    assert h.loads == ["embed"] and len(engines) == 1 and leases == 0
    assert h.phases() == {"chat": UNLOADED, "embed": LOADED} and h.models.used_bytes() == 50 * MB


def test_the_default_model_and_unknown_names() -> None:
    h = Harness({"chat": 100, "embed": 50}, 1000)
    assert h.models.resolve(None).name == h.models.resolve("").name == "chat"
    with pytest.raises(UnknownModel, match=r"the model 'gpt-9' does not exist; this daemon serves 'chat', 'embed'"):
        h.models.resolve("gpt-9")


def test_idle_models_make_room_least_recently_used_first_never_pinned_nor_busy() -> None:
    h = Harness({"chat": 400, "a": 300, "b": 300, "c": 300}, 1000, pinned=("chat",))

    async def go() -> Any:
        for name in ("chat", "a", "b"):         # 1000 MB held
            (await h.models.lease(name)).release()
            h.now += 1
        busy = await h.models.lease("a")         # a is older than b, but in use
        (await h.models.lease("c")).release()    # room for c: b goes (idle), not a (busy) nor chat (pinned)
        assert h.unloads == ["b"]
        busy.release()
        h.now += 1
        (await h.models.lease("b")).release()    # now a is the least recently used idle one
        assert h.unloads == ["b", "a"]
        a = h.models.slots["a"]
        c = await h.models.lease("c")
        (await h.models.lease("a")).release()    # b goes; c is busy
        c.release()
        return a

    run(go())
    assert h.unloads == ["b", "a", "b"] and h.phases()["chat"] == LOADED


def test_no_room_names_the_budget_and_what_holds_it() -> None:
    h = Harness({"chat": 600, "big": 500}, 1000, pinned=("chat",))

    async def go() -> None:
        (await h.models.lease("chat")).release()
        await h.models.lease("big")

    with pytest.raises(NoRoom, match=r"'big' needs at least 500 MiB and the memory budget of 1000 MiB has "
                                     r"400 MiB free; held: chat \(600 MiB, loaded, 0 requests in flight\)"):
        run(go())
    assert h.phases() == {"chat": LOADED, "big": UNLOADED} and h.models.used_bytes() == 600 * MB
    assert h.models.slots["big"].leases == 0


def test_keep_alive_unloads_idle_models_zero_at_once_negative_never() -> None:
    h = Harness({"chat": 100, "embed": 50, "rerank": 50}, 1000, keep_alive=300.0)

    async def go() -> None:
        for name in h.costs:
            (await h.models.lease(name)).release()
        lease = await h.models.lease("embed")
        lease.release(0.0)                        # the request's keep_alive: unload right after
        forever = await h.models.lease("rerank")
        forever.release(-1.0)
        await h.models.reap()
        assert h.unloads == ["embed"]
        h.now += 299
        await h.models.reap()
        assert h.unloads == ["embed"]
        h.now += 2
        await h.models.reap()                     # chat past its 5 minutes; rerank kept for good

    run(go())
    assert h.unloads == ["embed", "chat"] and h.phases()["rerank"] == LOADED
    assert h.models.slots["embed"].keep_alive_s == 0.0     # the request's became the model's


def test_a_model_in_use_is_not_reaped() -> None:
    h = Harness({"chat": 100}, 1000, keep_alive=0.0)

    async def go() -> None:
        lease = await h.models.lease("chat")
        engine = cast(FakeEngine, lease.engine)
        engine.num_streams = 1                   # a request still streaming after its front door let go
        lease.release()
        await h.models.reap()
        assert h.unloads == []
        engine.num_streams = 0
        await h.models.reap()

    run(go())
    assert h.unloads == ["chat"]


def test_a_failed_load_holds_nothing_and_reaches_every_waiter() -> None:
    h = Harness({"chat": 100, "broken": 100}, 1000, fail=("broken",))

    async def go() -> list[Any]:
        return await asyncio.gather(*[h.models.lease("broken") for _ in range(3)], return_exceptions=True)

    errors = run(go())
    assert all(isinstance(e, RuntimeError) and "damaged" in str(e) for e in errors)
    slot = h.models.slots["broken"]
    assert slot.phase == UNLOADED and slot.cost_bytes == 0 and slot.leases == 0 and slot.transition is None


def test_a_lease_waits_for_an_unload_then_loads_again() -> None:
    h = Harness({"chat": 100}, 1000)

    async def go() -> Any:
        (await h.models.lease("chat")).release()
        unloading = asyncio.ensure_future(h.models.unload(h.models.slots["chat"]))
        await asyncio.sleep(0)
        lease = await h.models.lease("chat")
        await unloading
        return lease

    lease = run(go())
    assert h.loads == ["chat", "chat"] and h.unloads == ["chat"] and lease.engine.stopped is False
