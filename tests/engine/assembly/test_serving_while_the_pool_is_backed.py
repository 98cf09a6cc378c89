"""The engine serves while the rest of its pool is backed in the background (engine/assembly/pool_backing.py): it
hands out only backed pages, behaves as with a smaller pool meanwhile, and keeps serving with what is
backed when backing runs out of memory. Backing is held or failed through create_engine's `back`."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from nvllm import LLM, SamplingParams
from nvllm.config import load_settings
from nvllm.engine.assembly import factory
from nvllm.engine.assembly.memory import MemoryReading
from nvllm.engine.assembly.pool_backing import PoolBacking
from nvllm.engine.async_engine import AsyncEngine
from nvllm.engine.llm_engine import LLMEngine
from nvllm.model.kv_cache import KVCache

TOTAL, MAX_LEN, BS = 32, 64, 16
FIRST = MAX_LEN // BS     # backed before the engine is built: one max_model_len sequence
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": list(range(3 + 7 * i, 3 + 7 * i + 20 + i))} for i in range(4)]


@pytest.fixture(scope="module")
def tiny(tiny_models) -> Path:
    return tiny_models["tiny-llama"]


def build(tiny: Path, back) -> LLMEngine:
    settings = load_settings(overrides={"model": {"path": str(tiny)}, "cache": {"num_blocks": TOTAL},
                                        "scheduler": {"max_model_len": MAX_LEN}})
    loaded = factory.load_model(settings)
    plan = factory.plan_pool(settings, loaded.info, MemoryReading(8 << 30, "test"))
    return factory.create_engine(settings, loaded, plan, back=back, eager_bytes=0)


class Held:
    """A `back` that waits for release() before backing anything."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.calls: list[tuple[int, int]] = []

    def __call__(self, kv: KVCache, start: int, stop: int) -> None:
        self.calls.append((start, stop))
        assert self.released.wait(30), "never released"
        kv.back_blocks(start, stop)


def run_checking_pages(engine: LLMEngine, limit: int) -> dict[str, list[int]]:
    """Step until every request ends; no block table ever holds a page at or past `limit`."""
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
        for seq in engine.seqs.values():
            assert all(b < limit for t in seq.block_tables for b in t), \
                f"an unbacked page was handed out: {seq.block_tables}"
        engine.block_manager.check_integrity(list(engine.seqs.values()))
    return tokens


@pytest.fixture(scope="module")
def reference(tiny: Path) -> list[list[int]]:
    return [o.token_ids for o in LLM(tiny, num_blocks=TOTAL, max_model_len=MAX_LEN).generate(PROMPTS, GREEDY)]


def test_requests_are_served_from_the_backed_blocks_while_the_rest_is_held(tiny, reference) -> None:
    held = Held()
    engine = build(tiny, held)
    try:
        assert engine.kv_cache.num_blocks == TOTAL
        assert isinstance(engine.backing, PoolBacking) and engine.backing.in_progress
        s = engine.stats()
        assert (s["pages_total"], s["pages_backed"], s["pages_free"]) == (TOTAL, FIRST, FIRST)
        for i, p in enumerate(PROMPTS):   # together they need more pages than are backed: they take turns
            engine.add_request(f"r{i}", p, GREEDY)
        tokens = run_checking_pages(engine, FIRST)
        assert [tokens[f"r{i}"] for i in range(len(PROMPTS))] == reference, "as with the whole pool"
        assert isinstance(engine.backing, PoolBacking) and engine.backing.in_progress
        assert engine.stats()["pages_backed"] == FIRST
        assert engine.stats()["preemptions"] > 0, "four requests in four pages had to take turns"
    finally:
        held.released.set()
    assert isinstance(engine.backing, PoolBacking) and engine.backing.wait(30)
    assert held.calls and held.calls[0][0] == FIRST and held.calls[-1][1] == TOTAL
    engine.add_request("after", PROMPTS[0], GREEDY)
    s = engine.stats()
    assert s["pages_backed"] == TOTAL and s["pool_backing_error"] == ""
    run_checking_pages(engine, TOTAL)
    engine.block_manager.check_integrity([])
    assert engine.block_manager.num_free_blocks == TOTAL


def test_a_failed_backing_leaves_a_working_smaller_pool(tiny, reference, caplog) -> None:
    def out_of_memory(kv: KVCache, start: int, stop: int) -> None:
        kv.back_blocks(start, start + 1)
        raise MemoryError("cannot back the KV page pool: Cannot allocate memory")

    engine = build(tiny, out_of_memory)
    assert isinstance(engine.backing, PoolBacking) and engine.backing.wait(30)
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"r{i}", p, GREEDY)
    tokens = run_checking_pages(engine, FIRST)
    assert [tokens[f"r{i}"] for i in range(len(PROMPTS))] == reference
    s = engine.stats()
    assert (s["pages_total"], s["pages_backed"]) == (TOTAL, FIRST)
    assert "out of memory" in s["pool_backing_error"]
    assert any("backing stopped at block 4 of 32" in r.getMessage() for r in caplog.records)


def test_backing_counts_whole_chunks_and_stops_at_the_first_failure() -> None:
    done: list[tuple[int, int]] = []

    def back(start: int, stop: int) -> None:
        if len(done) == 2:
            raise MemoryError("no more")
        done.append((start, stop))

    b = PoolBacking(back, 3, 20, bytes_per_block=1 << 20, chunk_bytes=4 << 20).start()
    assert b.wait(30) and not b.in_progress
    assert done == [(3, 7), (7, 11)] and b.backed == 11 and "no more" in (b.error or "")


def test_the_engine_thread_serves_while_backing_is_held(tiny) -> None:
    """The daemon's path: two requests that do not fit the backed pages together both finish through the
    engine thread before any more is backed, and the snapshot says total and backed."""
    held = Held()
    engine = build(tiny, held)

    async def go() -> tuple[list[str], dict]:
        ae = AsyncEngine(engine)
        ae.start()
        try:
            long = ae.prepare("long", list(range(3, 40)), SamplingParams(max_tokens=24, ignore_eos=True))
            short = ae.prepare("short", list(range(50, 80)), SamplingParams(max_tokens=4, ignore_eos=True))

            async def drain(seq) -> str:
                async for out in ae.generate(seq):
                    if out.finished:
                        return f"{seq.request_id}: {out.finish_reason}"
                return "no final output"

            finals = await asyncio.wait_for(asyncio.gather(drain(long), drain(short)), 60)
            return list(finals), ae.stats()
        finally:
            held.released.set()
            ae.shutdown()

    finals, stats = asyncio.run(go())
    assert finals == ["long: length", "short: length"]
    assert (stats["pages_total"], stats["pages_backed"]) == (TOTAL, FIRST)
