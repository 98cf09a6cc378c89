"""Updates in place (server/models/model_update.py) on a real ModelSet with real tiny engines: two GGUFs of
tiny-llama's shape with other weights (tiny-llama, tiny-llama-f16: other seeds, other greedy answers) take
turns at one path. A good new file is loaded beside the old one, checked and swapped in (new answers from the
new weights, the old engine unloaded once idle, the budget back to one model); a truncated or garbage file
leaves the old one serving, and Health and /metrics say why; requests stream while the model is swapped three
times: every one finishes whole on the version it started on, every page of every engine comes back; a budget
that holds one version drains the old one first (a request meanwhile waits, then gets the new one), gives up
past server.update_drain_s with the old one serving, and a bad file there leaves the model unloaded, saying
why; an embedder's new version is checked with an embedding."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from grpc_health.v1._async import HealthServicer

from helpers.daemon_util import assert_pages_all_back
from nvllm.config import Settings
from nvllm.engine.assembly.memory import MemoryReading
from nvllm.engine.async_engine import AsyncEngine
from nvllm.sampling_params import SamplingParams
from nvllm.server.models.model_loader import ModelLoader
from nvllm.server.models.model_set import LOADED, UNLOADED, ModelSet, ModelSpec
from nvllm.server.models.model_update import DEFERRED, FAILED, SWAPPED, UNCHANGED, ModelUpdates
from nvllm.server.state import DaemonState

NAME = "tiny-work"
PROMPT = "The quick brown fox"


def spec_of(path: Path, name: str = NAME, num_blocks: int = 64) -> ModelSpec:
    s = Settings()
    s.model.path = str(path)
    s.cache.num_blocks, s.cache.block_size = num_blocks, 16
    s.scheduler.max_model_len, s.scheduler.max_num_seqs, s.scheduler.max_num_batched_tokens = 256, 8, 256
    return ModelSpec(name, s, -1.0)


@pytest.fixture(scope="module")
def versions(tiny_ggufs: dict[str, Path]) -> tuple[Path, Path]:
    return tiny_ggufs["tiny-llama"], tiny_ggufs["tiny-llama-f16"]


def nan_weights(src: Path, dest: Path) -> None:
    """src with the back half of its bytes (tensor data) all ones: NaN in F32 and F16 alike, a file that loads
    but whose answers are not finite."""
    data = bytearray(src.read_bytes())
    data[len(data) // 2:] = b"\xff" * (len(data) - len(data) // 2)
    part = dest.with_name("." + dest.name + ".part")
    part.write_bytes(bytes(data))
    os.replace(part, dest)


def put(src: Path, dest: Path) -> None:
    """A new version put in place as an import does: written beside, renamed over (a new inode)."""
    part = dest.with_name("." + dest.name + ".part")
    shutil.copyfile(src, part)
    os.replace(part, dest)


async def answer(models: ModelSet, name: str = NAME, max_tokens: int = 8,
                 engines: list[AsyncEngine] | None = None) -> tuple[str, str]:
    """One greedy request through a lease, as submit runs one: (text, finish_reason)."""
    lease = await models.lease(name)
    try:
        if engines is not None and lease.engine not in engines:
            engines.append(lease.engine)
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        pending = lease.engine.prepare(f"r{id(object())}-{asyncio.get_running_loop().time()}", PROMPT, params)
        text, reason = "", ""
        async for out in lease.engine.generate(pending):
            assert out.error is None, out.error
            text += out.text
            reason = out.finish_reason or reason
        return text, reason
    finally:
        lease.release()


def run_set(work: Path, versions: tuple[Path, Path], body: Callable[[ModelSet, DaemonState, ModelUpdates],
            Awaitable[Any]], budget: int | None = None, drain_s: float = 30.0, num_blocks: int = 64) -> Any:
    """body(models, state, updates) over a ModelSet serving NAME from `work` and the two versions as ref-a and
    ref-b (for their answers); every engine stopped after."""
    loader = ModelLoader(lambda: MemoryReading(64 << 30, "test"))

    async def main() -> Any:
        refs = [] if budget else [spec_of(versions[0], "ref-a"), spec_of(versions[1], "ref-b")]
        specs = [spec_of(work, num_blocks=num_blocks), *refs]
        models = ModelSet(specs, NAME, budget or (8 << 30), loader.load, loader.unload, loader.least, loader.reclaim)
        state = DaemonState(NAME, HealthServicer(), 64, 8, 1 << 20)
        await state.set_ready(models, None)
        updates = ModelUpdates(drain_s)
        try:
            return await asyncio.wait_for(body(models, state, updates), 120)
        finally:
            await models.retired()
            for e in models.engines():
                await loader.unload(e)
    return asyncio.run(main())


def metric(state: DaemonState, outcome: str) -> float:
    body = state.metrics.exposition()[0].decode()
    line = f'nvllm:model_updates_total{{model_name="{NAME}",outcome="{outcome}"}} '
    found = [ln for ln in body.splitlines() if ln.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def test_a_good_new_file_is_swapped_in_and_a_bad_one_leaves_the_old_serving(tmp_path: Path,
                                                                             versions: tuple[Path, Path]) -> None:
    work = tmp_path / f"{NAME}.gguf"
    put(versions[0], work)

    async def body(models: ModelSet, state: DaemonState, updates: ModelUpdates) -> None:
        want_a, want_b = (await answer(models, "ref-a"))[0], (await answer(models, "ref-b"))[0]
        assert want_a != want_b
        assert (await answer(models))[0] == want_a
        assert (await updates.reload(models, NAME, changed_only=True)).outcome == UNCHANGED
        put(versions[1], work)
        old = models.slots[NAME].engine
        done = await updates.reload(models, NAME, changed_only=True)
        assert done.outcome == SWAPPED, done.reason
        assert models.slots[NAME].engine is not old and (await answer(models))[0] == want_b
        await models.retired()
        slot = models.slots[NAME]
        one = slot.held_bytes()             # the new version's alone (its weights are F16: less than the old)
        assert not slot.retiring and one == slot.cost_bytes and one < models.slots["ref-a"].cost_bytes
        assert old is not None and not old.is_running

        # a file cut short, garbage, weights that give NaN: each refused, the version serving untouched
        current = models.slots[NAME].engine
        for bad in (work.read_bytes()[: work.stat().st_size // 2], os.urandom(4096), b""):
            if bad:
                part = tmp_path / "bad.part"
                part.write_bytes(bad)
                os.replace(part, work)
            else:
                nan_weights(versions[1], work)
            done = await updates.reload(models, NAME)
            assert done.outcome == FAILED and "the old version serves on" in done.reason, done.reason
            assert models.slots[NAME].engine is current and (await answer(models))[0] == want_b
            assert models.slots[NAME].held_bytes() == one and models.slots[NAME].candidate is None
        row = next(m for m in state.read_health().models if m["name"] == NAME)
        assert row["update_state"] == "failed" and "serves on" in row["update_error"]
        assert "its check failed: NonFiniteLogits" in row["update_error"]
        assert metric(state, "failed") == 3 and metric(state, "swapped") == 1 and metric(state, "unchanged") == 1
        assert current is not None
        assert_pages_all_back(current.engine)

    run_set(work, versions, body)


def test_a_model_not_loaded_gets_its_new_files_on_its_next_load(tmp_path: Path, versions: tuple[Path, Path]) -> None:
    work = tmp_path / f"{NAME}.gguf"
    put(versions[0], work)

    async def body(models: ModelSet, state: DaemonState, updates: ModelUpdates) -> None:
        want_b = (await answer(models, "ref-b"))[0]
        await models.unload(models.slots[NAME])
        put(versions[1], work)
        assert (await updates.reload(models, NAME)).outcome == DEFERRED
        assert models.slots[NAME].phase == UNLOADED
        assert (await answer(models))[0] == want_b

    run_set(work, versions, body)


def test_requests_streaming_while_the_model_is_swapped_three_times(tmp_path: Path,
                                                                   versions: tuple[Path, Path]) -> None:
    work = tmp_path / f"{NAME}.gguf"
    put(versions[0], work)

    async def body(models: ModelSet, state: DaemonState, updates: ModelUpdates) -> None:
        wants = [(await answer(models, "ref-a", 24))[0], (await answer(models, "ref-b", 24))[0]]
        engines: list[AsyncEngine] = []
        results: list[tuple[str, str]] = []
        stop = asyncio.Event()

        async def client() -> None:
            while not stop.is_set():
                results.append(await answer(models, max_tokens=24, engines=engines))

        clients = [asyncio.create_task(client()) for _ in range(6)]
        await asyncio.sleep(0.3)
        for i in range(3):            # b, a, b
            put(versions[(i + 1) % 2], work)
            done = await updates.reload(models, NAME)
            assert done.outcome == SWAPPED, done.reason
            before = len(results)
            while len(results) < before + 12:     # the new version's answers among them
                await asyncio.sleep(0.02)
            assert models.slots[NAME].engine in engines
        stop.set()
        await asyncio.gather(*clients)
        await models.retired()
        assert all(reason == "length" for _, reason in results)
        assert {text for text, _ in results} <= set(wants), "an answer mixed two versions"
        assert {text for text, _ in results} == set(wants)
        assert (await answer(models, max_tokens=24))[0] == wants[1]       # the last version put in
        assert len(engines) == 4 and not models.slots[NAME].retiring
        assert models.slots[NAME].update.outcomes == {SWAPPED: 3}
        for e in engines:
            assert_pages_all_back(e.engine)
        assert [e.is_running for e in engines] == [False, False, False, True]

    run_set(work, versions, body)


def test_a_budget_that_holds_one_version_drains_the_old_first(tmp_path: Path, versions: tuple[Path, Path]) -> None:
    work = tmp_path / f"{NAME}.gguf"
    put(versions[0], work)
    loader = ModelLoader(lambda: MemoryReading(64 << 30, "test"))
    blocks = 1024          # a pool of megabytes: the loader wants 1 MiB of room for one at least
    one = max(loader.least(spec_of(v, num_blocks=blocks)) for v in versions)

    async def body(models: ModelSet, state: DaemonState, updates: ModelUpdates) -> None:
        slot = models.slots[NAME]
        first = (await answer(models, max_tokens=24))[0]
        running = asyncio.create_task(answer(models, max_tokens=48))      # on the old version, through the drain
        while slot.engine is None or not slot.engine.num_streams:
            await asyncio.sleep(0.01)
        put(versions[1], work)
        update = asyncio.create_task(updates.reload(models, NAME))
        while slot.update.state != "draining":
            await asyncio.sleep(0.01)
        waiting = asyncio.create_task(answer(models, max_tokens=24))       # waits for the new version
        done = await update
        assert done.outcome == SWAPPED and "drained" in done.reason, done.reason
        old_text, old_reason = await running
        assert old_reason == "length" and old_text.startswith(first)
        new_text, _ = await waiting
        assert new_text != first and models.used_bytes() <= models.budget_bytes

        # past update_drain_s the update gives up, the old version serving on
        updates.drain_s = 0.2
        lease = await models.lease(NAME)
        put(versions[0], work)
        done = await updates.reload(models, NAME)
        lease.release()
        assert done.outcome == FAILED and "update_drain_s" in done.reason and slot.phase == LOADED
        assert (await answer(models, max_tokens=24))[0] == new_text

        # a file that is no model fails before the old version is touched
        updates.drain_s = 30
        work.write_bytes(os.urandom(4096))
        done = await updates.reload(models, NAME)
        assert done.outcome == FAILED and "serves on" in done.reason and slot.phase == LOADED, done.reason
        # one that loads but does not answer, with no room to keep the old one beside it: the model is left
        # unloaded, and Health says why
        nan_weights(versions[1], work)
        done = await updates.reload(models, NAME)
        assert done.outcome == FAILED and "unloaded" in done.reason and slot.phase == UNLOADED, done.reason
        row = next(m for m in state.read_health().models if m["name"] == NAME)
        assert row["update_state"] == "failed" and row["update_error"] and models.used_bytes() == 0
        put(versions[0], work)
        assert (await answer(models, max_tokens=24))[0] == first and slot.phase == LOADED

    run_set(work, versions, body, budget=one * 3 // 2, num_blocks=blocks)


def test_an_embedder_is_checked_with_an_embedding(tiny_encoders: dict[str, Path]) -> None:
    loader = ModelLoader(lambda: MemoryReading(64 << 30, "test"))

    async def main() -> None:
        models = ModelSet([spec_of(tiny_encoders["tiny-bert"], "embedder")], "embedder", 8 << 30, loader.load,
                          loader.unload, loader.least, loader.reclaim)
        updates = ModelUpdates()
        (await models.lease("embedder")).release()
        old = models.slots["embedder"].engine
        assert old is not None and old.task == "embed"
        done = await updates.reload(models, "embedder")          # asked by name: reloaded, files changed or not
        assert done.outcome == SWAPPED, done.reason
        await models.retired()
        assert models.slots["embedder"].engine is not old and not old.is_running
        assert (await updates.reload(models, "embedder", changed_only=True)).outcome == UNCHANGED
        for e in models.engines():
            await loader.unload(e)
    asyncio.run(asyncio.wait_for(main(), 60))
