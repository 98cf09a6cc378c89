"""The async engine: the engine loop in its own thread, outputs to asyncio; and the servicer in process.

Fault injection here patches the engine's parts (the model's forward, the scheduler) to raise, and
`Hold` holds the engine thread still; the tests wait on events those patches set, never on a sleep
that a slow machine could outlast.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import grpc
import pytest

from nvllm import LLM, SamplingParams
from nvllm.engine.async_engine import AsyncEngine, EngineDead
from nvllm.engine.llm_engine import LLMEngine
from nvllm.model.decoder import Model
from nvllm.sampling_params import InvalidParameter

NUM_BLOCKS = 128



@pytest.fixture
def engine(tiny: Path) -> LLMEngine:
    return LLM(tiny, num_blocks=NUM_BLOCKS, max_num_seqs=32).engine


def run(coro_fn, engine: LLMEngine, heartbeat_s: float = 1.0):
    """Run coro_fn(async_engine) with a started AsyncEngine, shut down afterwards."""
    async def main():
        ae = AsyncEngine(engine, heartbeat_s=heartbeat_s)
        ae.start()
        try:
            return await coro_fn(ae)
        finally:
            ae.shutdown()
    return asyncio.run(main())


async def outputs_of(ae: AsyncEngine, rid: str, prompt, **params):
    seq = ae.prepare(rid, prompt, SamplingParams(**params))
    return [out async for out in ae.generate(seq)]


async def until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


class Hold:
    """Holds the engine thread at the top of its loop (inside has_unfinished, after it bumped
    `progress`) from the next iteration until release()."""

    def __init__(self, engine: LLMEngine) -> None:
        self.held = threading.Event()
        self._released = threading.Event()
        real = engine.has_unfinished

        def has_unfinished() -> bool:
            if not self._released.is_set():
                self.held.set()
                self._released.wait()
            return real()
        engine.has_unfinished = has_unfinished  # type: ignore[method-assign]  # held, on this engine only

    async def wait_held(self) -> None:
        assert await asyncio.get_running_loop().run_in_executor(None, self.held.wait, 10.0), "never held"

    def release(self) -> None:
        self._released.set()


def pages_back(ae: AsyncEngine) -> bool:
    s = ae.stats()
    return s["running"] == 0 and s["waiting"] == 0 and s["pages_free"] + s["pages_cached"] == s["pages_total"]


class TestStreams:
    def test_outputs_equal_the_offline_engine(self, engine: LLMEngine, tiny: Path) -> None:
        params = dict(temperature=0.7, seed=5, max_tokens=20, ignore_eos=True)
        outs = run(lambda ae: outputs_of(ae, "a", "hello there", **params), engine)
        want = LLM(tiny, num_blocks=NUM_BLOCKS).generate(["hello there"], SamplingParams(**params))[0]
        assert [t for o in outs for t in o.token_ids] == want.token_ids
        assert "".join(o.text for o in outs) == want.text
        assert outs[-1].finished and outs[-1].finish_reason == "length"
        assert not any(o.finished for o in outs[:-1])

    def test_a_thousand_streams_cost_no_thread_each(self, engine: LLMEngine) -> None:
        async def go(ae: AsyncEngine):
            threads = threading.active_count()
            peak = 0

            async def one(i):
                nonlocal peak
                outs = await outputs_of(ae, f"r{i}", [5, 6, 7], max_tokens=2, ignore_eos=True, seed=i)
                peak = max(peak, threading.active_count())
                return outs[-1]
            finals = await asyncio.gather(*[one(i) for i in range(1000)])
            return threads, peak, finals

        threads, peak, finals = run(go, engine)
        # No thread per stream; a thread of the process's own may end meanwhile (the engine fixture's
        # pool backing, when a loaded machine made it slow), so fewer is fine.
        assert peak <= threads
        assert all(f.finish_reason == "length" and f.completion_tokens == 2 for f in finals)

    def test_a_consumer_that_stops_early_aborts_and_frees_pages(self, engine: LLMEngine) -> None:
        async def go(ae: AsyncEngine):
            seq = ae.prepare("early", [1, 2, 3], SamplingParams(max_tokens=200, ignore_eos=True))
            async for _out in ae.generate(seq):
                assert ae.stats()["pages_free"] + ae.stats()["pages_cached"] < NUM_BLOCKS
                break
            await until(lambda: pages_back(ae))
            await until(lambda: ae.num_streams == 0)
            # The id is free again and the old request's abort reaches nobody.
            return await outputs_of(ae, "early", [1, 2, 3], max_tokens=3, ignore_eos=True)

        outs = run(go, engine)
        assert outs[-1].finish_reason == "length" and outs[-1].completion_tokens == 3
        engine.block_manager.check_integrity()

    def test_cancelling_the_consumer_aborts_the_request(self, engine: LLMEngine) -> None:
        async def go(ae: AsyncEngine):
            first = asyncio.Event()

            async def consume():
                seq = ae.prepare("c", [1, 2, 3], SamplingParams(max_tokens=200, ignore_eos=True))
                async for _ in ae.generate(seq):
                    first.set()
            task = asyncio.create_task(consume())
            await first.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await until(lambda: pages_back(ae))
            return ae.stats()

        stats = run(go, engine)
        assert stats["generated_tokens"] < 200

    def test_a_request_id_in_flight_is_refused(self, engine: LLMEngine) -> None:
        async def go(ae: AsyncEngine):
            s1 = ae.add(ae.prepare("dup", [1, 2], SamplingParams(max_tokens=50)))
            with pytest.raises(InvalidParameter) as e:
                ae.add(ae.prepare("dup", [1, 2], SamplingParams(max_tokens=5)))
            s1.close()
            return e.value

        assert run(go, engine).field == "request_id"

    def test_waiting_counts_requests_not_yet_taken_by_the_engine(self, engine: LLMEngine) -> None:
        async def go(ae: AsyncEngine):
            hold = Hold(engine)
            try:
                await hold.wait_held()
                streams = [ae.add(ae.prepare(f"w{i}", [1, 2], SamplingParams(max_tokens=2)))
                           for i in range(3)]
                waiting = ae.stats()["waiting"]
            finally:
                hold.release()
            finals = []
            for s in streams:
                finals.append([o async for o in s][-1])
            return waiting, finals, ae.stats()["waiting"]

        waiting, finals, after = run(go, engine)
        assert waiting == 3 and after == 0
        assert [f.completion_tokens for f in finals] == [2, 2, 2]


class TestLoop:
    def test_idle_loop_sleeps_and_wakes_for_the_heartbeat(self, engine: LLMEngine) -> None:
        heartbeat_s = 0.1

        async def go(ae: AsyncEngine):
            before, t0 = ae.progress, time.monotonic()
            await until(lambda: ae.progress >= before + 5)      # it wakes by itself: not stuck
            return time.monotonic() - t0

        took = run(go, engine, heartbeat_s=heartbeat_s)
        # Each of the 4 gaps between 5 idle iterations is a full heartbeat wait: a loop that spun would
        # take microseconds. (A slow machine only makes this longer.)
        assert took >= 3 * heartbeat_s

    def test_progress_stops_while_stalled(self, engine: LLMEngine) -> None:
        async def go(ae: AsyncEngine):
            hold = Hold(engine)
            try:
                await hold.wait_held()
                before = ae.progress
                await asyncio.sleep(0.5)     # how long it is watched; it stays held regardless
                during = ae.progress - before
            finally:
                hold.release()
            await until(lambda: ae.progress > before)
            return during

        assert run(go, engine, heartbeat_s=0.05) == 0     # ten heartbeats held: no progress

    def test_a_failing_step_fails_its_requests_and_the_loop_goes_on(self, engine: LLMEngine) -> None:
        assert isinstance(engine.model, Model)
        forward = engine.model.forward
        calls = {"n": 0}

        def flaky(*a, **k):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("injected")
            return forward(*a, **k)
        engine.model.forward = flaky  # type: ignore[method-assign]  # an injected fault, on this model only

        async def go(ae: AsyncEngine):
            failed = await outputs_of(ae, "f", [1, 2, 3], max_tokens=5)
            ok = await outputs_of(ae, "g", [1, 2, 3], max_tokens=5, ignore_eos=True)
            return failed, ok

        failed, ok = run(go, engine)
        assert failed[-1].error == "RuntimeError: injected" and failed[-1].finish_reason == "abort"
        assert ok[-1].error is None and ok[-1].completion_tokens == 5
        engine.block_manager.check_integrity()

    def test_an_error_outside_the_step_fails_all_and_keeps_the_thread(self, engine: LLMEngine) -> None:
        schedule = engine.scheduler.schedule
        calls = {"n": 0}

        def broken():
            # Fail once, when all three requests are in: under load they may arrive over several steps.
            if calls["n"] == 0 and len(engine.seqs) == 3:
                calls["n"] += 1
                raise RuntimeError("scheduler bug")
            return schedule()
        engine.scheduler.schedule = broken  # type: ignore[method-assign]  # an injected fault

        async def go(ae: AsyncEngine):
            results = await asyncio.gather(*[outputs_of(ae, f"x{i}", [1, 2, 3], max_tokens=50, ignore_eos=True)
                                             for i in range(3)])
            assert ae.is_running
            after = await outputs_of(ae, "y", [1, 2, 3], max_tokens=4, ignore_eos=True)
            return results, after

        results, after = run(go, engine)
        for outs in results:
            assert outs[-1].finished and "scheduler bug" in outs[-1].error
        assert after[-1].error is None and after[-1].completion_tokens == 4

    def test_shutdown_aborts_what_is_in_flight(self, engine: LLMEngine) -> None:
        async def go():
            ae = AsyncEngine(engine)
            ae.start()
            stream = ae.add(ae.prepare("s", [1, 2, 3], SamplingParams(max_tokens=200, ignore_eos=True)))
            first = await stream.__anext__()
            ae.shutdown()
            rest = [o async for o in stream]
            with pytest.raises(EngineDead):
                ae.add(ae.prepare("t", [1], SamplingParams(max_tokens=2)))
            return first, rest

        first, rest = asyncio.run(go())
        assert rest[-1].finished and rest[-1].finish_reason == "abort" and rest[-1].error is None
        assert engine.stats()["pages_free"] + engine.stats()["pages_cached"] == NUM_BLOCKS


class TestServicerInProcess:
    """Paths the daemon tests cannot reach: an engine failure (INTERNAL) and the STARTING state."""

    def test_engine_failure_is_internal_and_starting_is_unavailable(self, engine: LLMEngine) -> None:
        from grpc_health.v1._async import HealthServicer

        from nvllm.server.grpc.service import GeneratorService
        from nvllm.server.state import DaemonState
        from nvllm.v1 import nvllm_pb2 as pb
        from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

        def boom(*a, **k):
            raise FloatingPointError("injected")
        assert isinstance(engine.model, Model)
        engine.model.forward = boom  # type: ignore[method-assign]  # an injected fault, on this model only

        async def go():
            state = DaemonState("tiny", HealthServicer(), max_waiting=8, max_num_seqs=8, max_message_bytes=1 << 20)
            server = grpc.aio.server()
            pb_grpc.add_GeneratorServicer_to_server(GeneratorService(state), server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            ae = AsyncEngine(engine)
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                    stub = pb_grpc.GeneratorStub(ch)
                    req = pb.GenerateRequest(prompt="hi", sampling_params=pb.SamplingParams(max_tokens=3))
                    with pytest.raises(grpc.aio.AioRpcError) as starting:
                        [r async for r in stub.Generate(req)]
                    assert (await stub.Health(pb.HealthRequest())).state == pb.HealthResponse.STATE_STARTING
                    ae.start()
                    await state.set_ready(ae, None)
                    with pytest.raises(grpc.aio.AioRpcError) as failed:
                        [r async for r in stub.Generate(req)]
                    return starting.value, failed.value
            finally:
                ae.shutdown()
                await server.stop(0)

        starting, failed = asyncio.run(go())
        assert starting.code() == grpc.StatusCode.UNAVAILABLE and "starting" in starting.details()
        assert failed.code() == grpc.StatusCode.INTERNAL and "FloatingPointError: injected" in failed.details()
