"""Stress 2 and 3, load: overload against the queue bound, and churn (cancellations, deadlines,
disconnects) against leaks, against the real daemon on loopback.

Timing never decides an outcome: requests are held in flight by holding the engine loop still (SIGUSR1
to the tests' launcher, until the next SIGUSR1),
and the one rate compared (tokens/s before and after the churn) has a generous bound, best of three.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from helpers.daemon_util import (
    BASE_CONFIG,
    ROOT,
    DaemonProcess,
    assert_sound,
    config_with,
    health_when,
    joined,
    request,
    run_bounded,
)
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.stress, pytest.mark.slow]

MAX_NUM_SEQS = 16
MAX_WAITING = 64




def overload_request(i: int) -> pb.GenerateRequest:
    """Client i's request: greedy or seeded, of varied length."""
    prompt = f"Client {i} asks: " + " ".join(["what", "is", "the", "weather", "like", "today"][: 1 + i % 6])
    params: dict[str, Any] = dict(max_tokens=8 + i % 17, ignore_eos=i % 3 != 0)
    if i % 2:
        params.update(temperature=0.9, top_p=0.95, seed=1000 + i)
    else:
        params.update(temperature=0.0)
    req = request(prompt, **params)
    req.request_id = f"client-{i}"
    return req


@dataclass
class CallResult:
    code: grpc.StatusCode
    details: str = ""
    responses: list = field(default_factory=list)
    first_message_at: float | None = None
    ended_at: float = 0.0


async def run_call(stub: pb_grpc.GeneratorStub, req: pb.GenerateRequest, deadline_s: float) -> CallResult:
    out = CallResult(grpc.StatusCode.OK)
    try:
        async for r in stub.Generate(req, timeout=deadline_s):
            if out.first_message_at is None:
                out.first_message_at = time.monotonic()
            out.responses.append(r)
    except grpc.aio.AioRpcError as e:
        out.code, out.details = e.code(), e.details() or ""
    out.ended_at = time.monotonic()
    return out


# -- 2. overload ---------------------------------------------------------------------------------------
NUM_CLIENTS = 200
DEADLINE_S = 120.0


def test_overload_200_clients_against_a_queue_of_64(tiny: Path, tmp_path: Path, offline, reliability) -> None:
    """200 clients, each on its own connection, send at once while the engine holds still: 16 seats
    plus 64 queued are admitted and the other 120 refused at once (before any admitted request
    moved); every admitted one completes within its deadline with the text it gets alone."""
    config = config_with(BASE_CONFIG, max_num_seqs=MAX_NUM_SEQS, max_waiting=MAX_WAITING,
                         server__max_streams_per_client=NUM_CLIENTS + 56)   # all clients share 127.0.0.1
    d = DaemonProcess(tmp_path, tiny, config)
    try:
        async def go():
            channels = [grpc.aio.insecure_channel(d.address) for _ in range(NUM_CLIENTS)]
            try:
                await asyncio.gather(*[ch.channel_ready() for ch in channels])
                d.stall()
                sent_at = time.monotonic()
                calls = [asyncio.ensure_future(run_call(pb_grpc.GeneratorStub(ch), overload_request(i), DEADLINE_S))
                         for i, ch in enumerate(channels)]
                # Held still, the engine answers nobody: the calls that end now are the refusals.
                excess = NUM_CLIENTS - MAX_NUM_SEQS - MAX_WAITING
                while sum(c.done() for c in calls) < excess and time.monotonic() < sent_at + 60:
                    await asyncio.sleep(0.01)
                d.resume()
                results = await asyncio.wait_for(asyncio.gather(*calls), DEADLINE_S + 30)
                return sent_at, results
            finally:
                await asyncio.gather(*[ch.close() for ch in channels])

        sent_at, results = run_bounded(go())
        admitted = [i for i, r in enumerate(results) if r.code == grpc.StatusCode.OK]
        refused = [i for i, r in enumerate(results) if r.code == grpc.StatusCode.RESOURCE_EXHAUSTED]
        others = [(i, r.code, r.details) for i, r in enumerate(results) if i not in admitted and i not in refused]
        assert not others, others[:5]
        assert len(admitted) == MAX_NUM_SEQS + MAX_WAITING and len(refused) == NUM_CLIENTS - len(admitted)
        assert all(results[i].details == f"queue full: {MAX_WAITING} waiting, limit {MAX_WAITING}" for i in refused)
        # At once: every refusal came back while the engine still held still, before any admitted
        # request got its first message.
        first_progress = min(results[i].first_message_at for i in admitted)
        last_refusal = max(results[i].ended_at for i in refused)
        assert last_refusal < first_progress
        for i in admitted:
            last = results[i].responses[-1]
            assert last.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)
            assert last.usage.completion_tokens <= overload_request(i).sampling_params.max_tokens

        # The same requests alone, one at a time: the same text and tokens.
        with grpc.insecure_channel(d.address) as ch:
            stub = pb_grpc.GeneratorStub(ch)
            for i in admitted:
                alone = list(stub.Generate(overload_request(i), timeout=60))
                assert joined(results[i].responses) == joined(alone), f"client {i}"
        h = assert_sound(d, offline)
        reliability("overload", clients=NUM_CLIENTS, queue_bound=MAX_WAITING, seats=MAX_NUM_SEQS,
                    admitted=len(admitted), refused=len(refused), other_outcomes=len(others),
                    completed=len(admitted), equal_to_alone=len(admitted), hung=0,
                    slowest_refusal_ms=round(1000 * (last_refusal - sent_at)),
                    leaked_pages=h.pages_total - h.pages_free - h.pages_cached)
    finally:
        d.stop()


# -- 3. churn ------------------------------------------------------------------------------------------
NUM_CHURN = 2000
WARMUP = 200
IN_FLIGHT = 32
SUBPROCESS_CLIENTS = 5           # each holds STREAMS_PER_SUBPROCESS streams and is killed with SIGKILL
STREAMS_PER_SUBPROCESS = 20
KINDS = ("complete", "cancel", "deadline", "disconnect")
WEIGHTS = (40, 25, 20, 15)

KILLED_CLIENT = textwrap.dedent("""
    import asyncio, sys
    import grpc
    from nvllm.v1 import nvllm_pb2 as pb, nvllm_pb2_grpc as pb_grpc

    async def main(address, n, tag):
        async with grpc.aio.insecure_channel(address) as ch:
            stub = pb_grpc.GeneratorStub(ch)
            calls = [stub.Generate(pb.GenerateRequest(prompt=f"killed client {tag} stream {i}",
                     sampling_params=pb.SamplingParams(max_tokens=200, ignore_eos=True, temperature=0)))
                     for i in range(n)]
            for c in calls:
                await c.read()
            print("streaming", flush=True)
            await asyncio.sleep(3600)

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
""")


@dataclass
class Churn:
    outcomes: dict = field(default_factory=dict)

    def count(self, what: str) -> None:
        self.outcomes[what] = self.outcomes.get(what, 0) + 1


async def churn_one(address: str, shared: grpc.aio.Channel, rng: random.Random, i: int, tally: Churn) -> None:
    kind = rng.choices(KINDS, WEIGHTS)[0]
    req = request(f"churn {i} " + "word " * rng.randint(0, 40), max_tokens=rng.randint(1, 32),
                  temperature=rng.choice([0.0, 0.8]), seed=i, ignore_eos=rng.random() < 0.5)
    req.priority = rng.choice([0, 0, 0, 1, -1, 5])   # priority preemption in the churn too
    if kind == "complete":
        r = await run_call(pb_grpc.GeneratorStub(shared), req, 120)
        assert r.code == grpc.StatusCode.OK, (r.code, r.details)
        assert r.responses[-1].finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)
        tally.count("completed")
    elif kind == "cancel":
        call = pb_grpc.GeneratorStub(shared).Generate(req, timeout=120)
        for _ in range(rng.randint(0, 3)):
            if await call.read() is grpc.aio.EOF:
                break
        call.cancel()
        tally.count("cancelled")
    elif kind == "deadline":
        r = await run_call(pb_grpc.GeneratorStub(shared), req, rng.uniform(0.005, 0.3))
        assert r.code in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED), (r.code, r.details)
        tally.count("deadline passed" if r.code == grpc.StatusCode.DEADLINE_EXCEEDED else "deadline met")
    else:   # the connection goes away under the stream
        ch = grpc.aio.insecure_channel(address)
        call = pb_grpc.GeneratorStub(ch).Generate(req, timeout=120)
        for _ in range(rng.randint(0, 2)):
            if await call.read() is grpc.aio.EOF:
                break
        await ch.close()
        tally.count("disconnected")


async def churn(address: str, start: int, n: int, seed: int, tally: Churn) -> None:
    rng = random.Random(seed)
    gate = asyncio.Semaphore(IN_FLIGHT)
    async with grpc.aio.insecure_channel(address) as shared:
        async def one(i: int) -> None:
            async with gate:
                await churn_one(address, shared, random.Random(rng.random()), i, tally)
        await asyncio.gather(*[one(i) for i in range(start, start + n)])


def killed_clients(address: str, tally: Churn) -> None:
    """Client processes that hold streams and die with SIGKILL (one after the other): the TCP
    connection just drops, with no cancellation sent."""
    for k in range(SUBPROCESS_CLIENTS):
        p = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, address, str(STREAMS_PER_SUBPROCESS), str(k)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert p.stdout is not None
        try:
            line = p.stdout.readline()
            assert line.strip() == "streaming", line + p.stdout.read()
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait()
            p.stdout.close()
        for _ in range(STREAMS_PER_SUBPROCESS):
            tally.count("client killed")


async def fixed_workload(address: str) -> float:
    """Generated tokens per second for 16 greedy requests of 32 tokens at once."""
    async with grpc.aio.insecure_channel(address) as ch:
        stub = pb_grpc.GeneratorStub(ch)
        t0 = time.monotonic()
        results = await asyncio.gather(*[run_call(stub, request(f"steady {i}", max_tokens=32, ignore_eos=True,
                                                                temperature=0.0), 120) for i in range(16)])
        took = time.monotonic() - t0
    assert all(r.code == grpc.StatusCode.OK for r in results)
    return sum(r.responses[-1].usage.completion_tokens for r in results) / took


def interleaved_rates(a: str, b: str, rounds: int = 5) -> tuple[float, float]:
    """Tokens/s of the fixed workload on daemons a and b, run in turns (one warm-up each) so that
    both see the same load on the machine; each the total over its rounds."""
    took = {a: 0.0, b: 0.0}
    for address in (a, b):
        run_bounded(fixed_workload(address))
    for _ in range(rounds):
        for address in (a, b):
            t0 = time.monotonic()
            run_bounded(fixed_workload(address))
            took[address] += time.monotonic() - t0
    return 16 * 32 * rounds / took[a], 16 * 32 * rounds / took[b]


def test_churn_2000_requests_leaks_nothing(tiny: Path, tmp_path: Path, offline, reliability) -> None:
    """2,000 requests of mixed priorities (so some preempt others), most of them cancelled, run past
    their deadline or cut off with their connection: every page comes back, the per-client stream
    count comes back to zero, the resident set stays within 5% of its size after warm-up, and the
    engine is as fast at the end as a fresh daemon's.

    Speed is compared with a fresh daemon measured in turns with the churned one rather than with the
    churned one's own speed before: on a shared machine the load changes more between "before" and
    "after" than any slowdown worth catching, but it is the same for two daemons taking turns."""
    config = config_with(BASE_CONFIG, max_num_seqs=MAX_NUM_SEQS, max_waiting=MAX_WAITING)
    d = DaemonProcess(tmp_path, tiny, config)
    try:
        tally = Churn()
        run_bounded(churn(d.address, 0, WARMUP, 1, tally))
        health_when(d.address, lambda h: h.running == 0 and h.waiting == 0, "warm-up to settle", 30)
        rss_warm = d.rss()
        t0 = time.monotonic()
        rest = NUM_CHURN - WARMUP - SUBPROCESS_CLIENTS * STREAMS_PER_SUBPROCESS
        run_bounded(churn(d.address, WARMUP, rest // 2, 2, tally))
        killed_clients(d.address, tally)
        run_bounded(churn(d.address, WARMUP + rest // 2, rest - rest // 2, 3, tally))
        churn_s = time.monotonic() - t0
        h = assert_sound(d, offline)
        rss_end = d.rss()
        fresh = DaemonProcess(tmp_path / "fresh", tiny, config)
        try:
            rate_churned, rate_fresh = interleaved_rates(d.address, fresh.address)
        finally:
            fresh.stop()
        tried = sum(tally.outcomes.values())
        assert tried == NUM_CHURN

        # The per-client stream count is back to zero: the default limit of 64 admits exactly 64.
        async def at_the_limit():
            async with grpc.aio.insecure_channel(d.address) as ch:
                stub = pb_grpc.GeneratorStub(ch)
                d.stall()
                calls = [stub.Generate(request(f"limit {i}", max_tokens=64, ignore_eos=True, temperature=0.0))
                         for i in range(64)]
                deadline = time.monotonic() + 30
                while (await stub.Health(pb.HealthRequest())).waiting < 64:
                    assert time.monotonic() < deadline, "the 64 streams were not all admitted"
                    await asyncio.sleep(0.02)
                extra = await run_call(stub, request("one more", max_tokens=2), 30)
                d.resume()
                done = []
                for c in calls:
                    done.append([r async for r in c])
                return extra, done
        extra, done = run_bounded(at_the_limit())
        assert extra.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "server.max_streams_per_client" in extra.details
        assert all(r[-1].finish_reason == pb.FINISH_REASON_LENGTH for r in done)
        h = assert_sound(d, offline)

        drift = (rss_end - rss_warm) / rss_warm
        assert abs(drift) <= 0.05, f"resident set {rss_warm / 2**20:.1f} MiB -> {rss_end / 2**20:.1f} MiB"
        assert rate_churned >= 0.5 * rate_fresh, f"tokens/s {rate_churned:.0f} churned, {rate_fresh:.0f} fresh"
        reliability("churn", requests=tried, **{k.replace(" ", "_"): v for k, v in sorted(tally.outcomes.items())},
                    leaked_pages=h.pages_total - h.pages_free - h.pages_cached,
                    rss_after_warmup_mib=round(rss_warm / 2**20, 1), rss_end_mib=round(rss_end / 2**20, 1),
                    rss_drift_pct=round(100 * drift, 2), tokens_per_s_churned=round(rate_churned),
                    tokens_per_s_fresh=round(rate_fresh), speed_ratio=round(rate_churned / rate_fresh, 2),
                    aborted_in_engine=sum("request aborted" in line for line in d.lines),
                    churn_s=round(churn_s, 1))
    finally:
        d.stop()
