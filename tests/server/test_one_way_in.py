"""DaemonState.submit, the one way in for every front door, on the real engine (a tiny model): what it refuses
and counts, what a Submission streams, and that it gives back the client's stream, its metrics and its
engine requests exactly once however it ends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from grpc_health.v1._async import HealthServicer
from prometheus_client.parser import text_string_to_metric_families

from helpers.daemon_util import assert_pages_all_back, drained
from nvllm import LLM, SamplingParams
from nvllm.engine.async_engine import AsyncEngine
from nvllm.engine.llm_engine import LLMEngine
from nvllm.sampling_params import InvalidParameter
from nvllm.server.models.model_set import UnknownModel
from nvllm.server.reading import Reading, Served
from nvllm.server.state import DaemonState, Refused

CLIENT = "10.0.0.7"
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_models: dict[str, Path]) -> LLMEngine:
    return LLM(tiny_models["tiny-llama"], num_blocks=64, max_num_seqs=4).engine


def run(engine: LLMEngine, body: Callable[[DaemonState], Awaitable[Any]], ready: bool = True) -> Any:
    """body(state) on a started AsyncEngine; every page back afterwards."""
    async def main() -> Any:
        ae = AsyncEngine(engine)
        ae.start()
        state = DaemonState("tiny-llama", HealthServicer(), 8, 4, 1 << 20)
        if ready:
            await state.set_ready(ae, None)
        try:
            result = await body(state)
            await drained(engine, ae)
            return result
        finally:
            ae.shutdown()
    result = asyncio.run(main())
    assert_pages_all_back(engine)
    return result


def counted(state: DaemonState) -> dict[str, float]:
    """gRPC's requests admitted and refused by reason, as /metrics gives them."""
    body, _ = state.metrics.exposition()
    counts = {"admitted": 0.0, "invalid": 0.0, "busy": 0.0, "unavailable": 0.0}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.labels.get("api") != "grpc" or not sample.name.endswith("_total"):
                continue
            if sample.name == "nvllm:requests_total":
                counts["admitted"] = sample.value
            elif sample.name == "nvllm:requests_refused_total":
                counts[sample.labels["reason"]] = sample.value
    return counts


def test_two_choices_stream_apart_and_everything_comes_back_once(engine: LLMEngine) -> None:
    async def body(state: DaemonState) -> Any:
        state.open_stream(CLIENT)             # another call of the same client, still open
        sub = await state.submit("grpc", CLIENT, "r", [("The quick brown fox", GREEDY), ([5, 6, 7], GREEDY)])
        assert state.streams_by_client[CLIENT] == 2 and sub.num_choices == 2
        assert sub.prompt_tokens[1] == 3 and sub.max_tokens == [6, 6] and sub.thinks
        tokens: dict[int, list[int]] = {0: [], 1: []}
        finals = []
        async with sub:
            async for index, out in sub:
                tokens[index] += out.token_ids
                if out.finished:
                    finals.append((index, out.finish_reason, out.request_id))
        sub.close()                           # again: nothing more is given back
        return tokens, sorted(finals), dict(state.streams_by_client), counted(state)

    tokens, finals, streams, counts = run(engine, body)
    assert [len(tokens[0]), len(tokens[1])] == [6, 6]
    assert finals == [(0, "length", "r-0"), (1, "length", "r-1")]
    assert streams == {CLIENT: 1}, "the submission gave its stream back once, not the other call's"
    assert counts == {"admitted": 2, "invalid": 0, "busy": 0, "unavailable": 0}


def test_leaving_early_aborts_the_engine_requests(engine: LLMEngine) -> None:
    async def body(state: DaemonState) -> Any:
        sub = await state.submit("grpc", CLIENT, "long", [([1, 2, 3], SamplingParams(max_tokens=200, ignore_eos=True))])
        async with sub:
            async for _, out in sub:
                if out.token_ids:
                    break
        for _ in range(500):
            if engine.stats()["running"] == 0:
                break
            await asyncio.sleep(0.01)
        return engine.stats()["running"], dict(state.streams_by_client)

    running, streams = run(engine, body)
    assert running == 0 and streams == {}


def test_refusals_raise_count_and_give_the_stream_back(engine: LLMEngine) -> None:
    async def body(state: DaemonState) -> Any:
        seen: list[Any] = []
        with pytest.raises(InvalidParameter) as e:      # the engine's check, naming its own field
            await state.submit("grpc", CLIENT, "big", [("Hi", SamplingParams(max_tokens=10**6))])
        seen.append(e.value.field)
        with pytest.raises(InvalidParameter):           # one bad choice refuses them all
            await state.submit("grpc", CLIENT, "two", [("Hi", GREEDY), ("Hi", SamplingParams(top_k=-5))])
        state.max_streams_per_client = 1
        state.open_stream(CLIENT)
        with pytest.raises(Refused) as r:
            await state.submit("grpc", CLIENT, "capped", [("Hi", GREEDY)])
        seen.append(r.value.busy)
        state.close_stream(CLIENT)
        return seen, dict(state.streams_by_client), counted(state), engine.stats()["running"]

    seen, streams, counts, running = run(engine, body)
    assert seen == ["max_tokens", True]
    assert streams == {} and running == 0
    assert counts == {"admitted": 0, "invalid": 2, "busy": 1, "unavailable": 0}


def test_starting_is_refused_as_unavailable(engine: LLMEngine) -> None:
    async def body(state: DaemonState) -> Any:
        with pytest.raises(Refused) as r:
            await state.submit("grpc", CLIENT, "early", [("Hi", GREEDY)])
        return r.value.busy, str(r.value), dict(state.streams_by_client), counted(state)

    busy, message, streams, counts = run(engine, body, ready=False)
    assert not busy and "starting" in message and streams == {}
    assert counts["unavailable"] == 1 and counts["admitted"] == 0


class NamedRefusal(Exception):
    """A front door's own refusal (its wire format's), as a reader or a Reading's refusal raises it."""


def test_a_reader_reads_by_the_model_leased_and_its_refusals_are_counted_here(engine: LLMEngine) -> None:
    """With a reader, submit leases the model named, reads the request by it, and counts and gives back
    what either refuses: the reader's own refusal as raised, the engine's named by the Reading."""
    def reading(params: SamplingParams) -> Callable[[Served], Reading]:
        def read(served: Served) -> Reading:
            read_by.append(served.model_name)
            return Reading([("Hi", params)], lambda e: NamedRefusal(f"body.{e.field}"), keep_alive_s=0.5)
        return read

    def refuse(served: Served) -> Reading:
        raise NamedRefusal("a field the reader refused")

    read_by: list[str] = []

    async def body(state: DaemonState) -> Any:
        seen: list[str] = []
        sub = await state.submit("grpc", CLIENT, "read", reading(GREEDY), model="tiny-llama")
        async with sub:
            async for _ in sub:
                pass
        for read in (refuse, reading(SamplingParams(max_tokens=10**6))):
            with pytest.raises(NamedRefusal) as e:
                await state.submit("grpc", CLIENT, "refused", read)
            seen.append(str(e.value))
        with pytest.raises(UnknownModel):
            await state.submit("grpc", CLIENT, "unknown", reading(GREEDY), model="no-such-model")
        assert state.models is not None
        leased = [s.leases for s in state.models.slots.values()]
        return seen, dict(state.streams_by_client), counted(state), leased

    seen, streams, counts, leased = run(engine, body)
    assert read_by == ["tiny-llama"] * 2       # the refusing reader reads nothing; an unknown model none
    assert seen == ["a field the reader refused", "body.max_tokens"]
    assert streams == {} and leased == [0]
    assert counts == {"admitted": 1, "invalid": 3, "busy": 0, "unavailable": 0}
