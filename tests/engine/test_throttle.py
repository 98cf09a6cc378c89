"""An engine held back while the board is hot (LLMEngine.throttle, AsyncEngine.set_throttle): fewer matmul
threads and a smaller step budget from the next step on, both restored when it clears; never a preemption nor
another order, so greedy answers are the same; a request of priority < 0 keeps the whole budget while it runs
or waits; an encoder keeps its budget (it admits an input only whole) and loses threads only."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from golden.pooling_cases import EMBED_TEXTS
from helpers.engines import backed_engine
from nvllm import SamplingParams
from nvllm.config import load_settings
from nvllm.engine.async_engine import AsyncEngine
from nvllm.engine.llm_engine import LLMEngine
from nvllm.model.kernels import threads
from nvllm.pooling_params import PoolingParams

BUDGET = 64


@pytest.fixture(autouse=True)
def threads_back() -> Iterator[None]:
    """The thread count is the process's: put it back for the tests after."""
    was = threads.count
    yield
    threads.configure(was)


def engine(model: Path, n_threads: int = 4, **scheduler: int) -> LLMEngine:
    return backed_engine(load_settings(overrides={
        "model": {"path": str(model), "threads": n_threads}, "cache": {"num_blocks": 256, "block_size": 16},
        "scheduler": {"max_num_batched_tokens": BUDGET, "max_model_len": 512, **scheduler}}))


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def long_prompt(seed: int, n: int = 150) -> list[int]:
    return [(7 * seed + 3 * k) % 200 + 3 for k in range(n)]


def step_tokens(eng: LLMEngine, steps: int) -> list[int]:
    seen = []
    for _ in range(steps):
        eng.step()
        seen.append(eng.last_step_tokens)
    return seen


def answers(eng: LLMEngine) -> dict[str, list[int]]:
    got: dict[str, list[int]] = {}
    while eng.has_unfinished():
        for out in eng.step():
            got.setdefault(out.request_id, []).extend(out.token_ids)
    return got


def test_the_budget_and_threads_drop_between_steps_and_come_back(tiny: Path) -> None:
    eng = engine(tiny)
    assert eng.threads == 4 and threads.count == 4
    eng.add_request("a", long_prompt(1, 200), greedy(4))
    assert step_tokens(eng, 1) == [BUDGET]
    eng.throttle(True, 0.5, 0.5)
    assert threads.count == 2 and eng.scheduler.throttled_budget == BUDGET // 2
    assert step_tokens(eng, 2) == [BUDGET // 2] * 2
    eng.throttle(False, 0.5, 0.5)
    assert threads.count == 4 and eng.scheduler.throttled_budget is None
    assert step_tokens(eng, 1) == [BUDGET]


def test_floors_one_thread_and_a_page_of_tokens(tiny: Path) -> None:
    eng = engine(tiny, n_threads=3)
    eng.throttle(True, 0.01, 0.01)
    assert threads.count == 1 and eng.scheduler.throttled_budget == 16     # cache.block_size


def test_throttled_answers_are_the_same_and_nothing_is_preempted(tiny: Path) -> None:
    free, hot = engine(tiny, max_num_seqs=8), engine(tiny, max_num_seqs=8)
    hot.throttle(True, 0.5, 0.25)
    for eng in (free, hot):
        for i in range(6):
            eng.add_request(f"r{i}", long_prompt(i, 40 + 9 * i), greedy(12))
    assert answers(hot) == answers(free)
    assert hot.scheduler.num_preemptions == free.scheduler.num_preemptions == 0
    assert hot.num_steps > free.num_steps       # the smaller budget took more steps


def test_a_priority_minus_one_request_keeps_the_whole_budget(tiny: Path) -> None:
    eng = engine(tiny)
    eng.throttle(True, 0.5, 0.5)
    eng.add_request("routine", long_prompt(1, 200), greedy(40))
    assert step_tokens(eng, 1) == [BUDGET // 2]
    eng.add_request("urgent", long_prompt(2, 100), greedy(2), priority=-1)
    assert step_tokens(eng, 2) == [BUDGET, BUDGET]         # while it waits, then runs: the whole budget
    finished: set[str] = set()
    while "urgent" not in finished:
        finished |= {out.request_id for out in eng.step() if out.finished}
        assert eng.last_step_tokens <= BUDGET
    assert "routine" not in finished and eng.scheduler.step_budget() == BUDGET // 2   # throttled again
    eng.add_request("later", long_prompt(3, 200), greedy(2))
    assert step_tokens(eng, 1) == [BUDGET // 2]            # routine's decode and 31 of later's prompt


def test_an_encoder_keeps_its_budget_and_loses_threads(tiny_encoders: dict[str, Path]) -> None:
    eng = engine(tiny_encoders["tiny-bert"])
    eng.throttle(True, 0.5, 0.5)
    assert threads.count == 2 and eng.scheduler.throttled_budget is None
    eng.add_request("e", EMBED_TEXTS[5], PoolingParams())     # 42 tokens: more than half the budget, in one step
    outs = eng.step()
    assert [o.request_id for o in outs if o.finished] == ["e"] and outs[0].pooled is not None


def test_set_throttle_goes_through_the_engine_thread(tiny: Path) -> None:
    eng = engine(tiny)
    seen: list[tuple[int, int]] = []     # (tokens, threads.count) of each step, on the engine thread

    async def main() -> None:
        async_engine = AsyncEngine(eng, on_step=lambda s, tokens: seen.append((tokens, threads.count)))
        async_engine.start()
        try:
            async_engine.set_throttle(True, 0.5, 0.5)
            async for _ in async_engine.generate(async_engine.prepare("a", long_prompt(1, 200), greedy(2))):
                pass
            async_engine.set_throttle(False, 0.5, 0.5)
            async for _ in async_engine.generate(async_engine.prepare("b", long_prompt(2, 200), greedy(2))):
                pass
        finally:
            async_engine.shutdown()

    asyncio.run(main())
    hot, cool = seen[:8], seen[8:]
    assert hot[:6] == [(BUDGET // 2, 2)] * 6 and hot[6:] == [(200 - 6 * BUDGET // 2, 2), (1, 2)]
    assert cool[:3] == [(BUDGET, 4)] * 3 and cool[3:] == [(200 - 3 * BUDGET, 4), (1, 4)]


def test_each_engine_steps_with_its_own_threads(tiny: Path) -> None:
    """Two models' engines in one process (several models), model.threads 1 and 3: each step sets the
    process's count to its engine's, throttled or not."""
    one, three = engine(tiny, 1), engine(tiny, 3)
    assert threads.count == 3                       # the last built set it
    one.add_request("a", "Hello", greedy(2))
    one.use_threads()
    one.step()
    assert threads.count == 1
    three.throttle(True, 0.5, 0.5)
    one.use_threads()
    assert threads.count == 1
    three.use_threads()
    assert threads.count == 1 == three.step_threads    # 3 x 0.5, at least 1
    three.throttle(False)
    one.use_threads()
    three.use_threads()
    assert threads.count == 3
