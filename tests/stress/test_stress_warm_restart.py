"""Stress: restarts with a persisted prefix cache and a pinned system prompt, under concurrent load.

Each round sends a burst of chat questions under the pinned system prompt and plain prompts of their own,
the first burst right after readiness (so some requests run while the file is still being read back),
then drains with requests in flight (SIGTERM) and starts again on the file that drain wrote. Nothing may
go wrong (every greedy answer equals a cold engine's) and nothing may leak (after each burst every page
is free or cached but the pinned ones).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from helpers.daemon_util import BASE_CONFIG, DaemonProcess, config_with, health, joined, request, run_bounded, wait_for
from helpers.warm_cache import SYSTEM, write_prompt
from nvllm import SamplingParams
from nvllm.engine.warm.pinned_prompts import read_pinned_prompts
from nvllm.text.tokenizer import Tokenizer
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.stress, pytest.mark.slow]

ROUNDS = 3
BURST = 24
BLOCK = 16
PARAMS: dict[str, Any] = dict(temperature=0.0, max_tokens=12, ignore_eos=True)


def question(i: int) -> str:
    return f"Question {i}: how much battery is left after waypoint {i % 7}?"


def chat_request(i: int) -> pb.GenerateRequest:
    msgs = [pb.ChatMessage(role="system", content=SYSTEM), pb.ChatMessage(role="user", content=question(i))]
    req = pb.GenerateRequest(chat=pb.ChatMessages(messages=msgs))
    req.sampling_params.CopyFrom(pb.SamplingParams(**PARAMS))
    return req


def plain_prompt(i: int) -> str:
    return f"Log entry {i}: " + " ".join(["wind", "gusts", "north", "east", "rain", "clear"] * (1 + i % 5))


def burst_requests(round_: int) -> list[tuple[str, pb.GenerateRequest]]:
    out: list[tuple[str, pb.GenerateRequest]] = []
    for k in range(BURST):
        i = round_ * BURST + k
        out.append((f"chat-{i}", chat_request(i)) if k % 2 == 0 else (f"plain-{i}", request(plain_prompt(i), **PARAMS)))
    return out


def expected(offline, name: str) -> list[int]:
    kind, i = name.split("-")
    prompt: Any = ({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question(int(i))}]}
                   if kind == "chat" else plain_prompt(int(i)))
    return offline.generate([prompt], SamplingParams(**PARAMS))[0].token_ids


async def send_all(address: str, reqs: list[tuple[str, pb.GenerateRequest]]) -> dict[str, list[pb.GenerateResponse]]:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = pb_grpc.GeneratorStub(ch)

        async def one(req: pb.GenerateRequest) -> list[pb.GenerateResponse]:
            return [r async for r in stub.Generate(req, timeout=120)]
        got = await asyncio.gather(*(one(r) for _, r in reqs))
    return {name: out for (name, _), out in zip(reqs, got)}


def settled_but_pinned(address: str, pinned_pages: int) -> pb.HealthResponse:
    def check() -> pb.HealthResponse | None:
        h = health(address)
        ok = h.running == 0 and h.waiting == 0 and h.pages_free + h.pages_cached == h.pages_total - pinned_pages
        return h if ok else None
    return wait_for(check, f"every page but the {pinned_pages} pinned to be free or cached", 30)


async def drain_under_load(d: DaemonProcess, reqs: list[tuple[str, pb.GenerateRequest]]
                           ) -> dict[str, list[pb.GenerateResponse]]:
    """reqs sent, SIGTERM once they are on their way; what they answered."""
    task = asyncio.ensure_future(send_all(d.address, reqs))
    await asyncio.sleep(0.05)
    d.proc.terminate()
    return await task


def test_restarts_with_a_persisted_cache_leak_nothing_and_answer_as_cold(tiny: Path, offline, tmp_path: Path,
                                                                         reliability) -> None:
    prompt = write_prompt(tmp_path / "system.json", {"messages": [{"role": "system", "content": SYSTEM}]})
    config = config_with(BASE_CONFIG, cache__pinned_prompts=[prompt], cache__persist_dir=str(tmp_path / "store"))
    pinned_tokens = len(read_pinned_prompts([prompt], Tokenizer.from_dir(tiny), 10**6, 4096, BLOCK)[0].token_ids)
    pinned_pages = pinned_tokens // BLOCK
    answers = checked = late_answers = 0
    min_cached_after_restart = None
    for round_ in range(ROUNDS):
        d = DaemonProcess(tmp_path / f"round-{round_}", tiny, config)
        try:
            # Straight after readiness: the file may still be read back while these run.
            got = run_bounded(send_all(d.address, burst_requests(round_)))
            for name, out in got.items():
                assert joined(out)[1] == expected(offline, name), f"round {round_}: {name} differs from cold"
                answers += 1
            d.wait_line("pinned prompt ")
            settled_but_pinned(d.address, pinned_pages)
            # Warm now: every chat question finds the pinned pages.
            again = run_bounded(send_all(d.address, [(f"chat-{1000 + round_}", chat_request(1000 + round_))]))
            usage = next(iter(again.values()))[-1].usage
            assert usage.cached_tokens >= pinned_tokens
            if round_:
                assert any("pages read back" in line for line in d.lines), d.log()
                first_cached = min(out[-1].usage.cached_tokens for name, out in got.items() if name.startswith("chat"))
                min_cached_after_restart = first_cached if min_cached_after_restart is None else \
                    min(min_cached_after_restart, first_cached)
            settled_but_pinned(d.address, pinned_pages)
            checked += 1
            # Drain with requests in flight: they finish, then the cache is written.
            drain = drain_under_load(d, burst_requests(100 + round_)[:8])
            try:
                late = run_bounded(drain)
            except grpc.aio.AioRpcError as e:   # sent after the drain began: refused, never wrong
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                late = {}
            for name, out in late.items():
                assert joined(out)[1] == expected(offline, name)
                late_answers += 1
            rc = d.wait(60)
        finally:
            if d.proc.poll() is None:
                d.stop()
        assert rc == 0, d.log()
        assert any("written to" in line for line in d.lines), d.log()
    reliability("warm_restart", rounds=ROUNDS, answers=answers, answered_through_drain=late_answers,
                leak_checks=checked,
                pinned_tokens=pinned_tokens, min_cached_in_first_burst_after_restart=min_cached_after_restart)
