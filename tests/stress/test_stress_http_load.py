"""The stress group over the HTTP API, load: overload against the queue bound, and churn (disconnects,
client timeouts, killed clients) against leaks, against the real daemon on loopback.

The same rules as the gRPC stress tests (test_stress_load.py): requests are held in flight by holding the
engine loop still, never by timing; zero crashes (no 5xx, no ERROR line or traceback in the daemon's
log); every page free or cached at the end and the reference request answered as before. Figures go to
the reliability record (docs/reliability.md quotes them).
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

import httpx2 as httpx
import pytest

from helpers.daemon_util import (
    BASE_CONFIG,
    ROOT,
    DaemonProcess,
    assert_sound,
    config_with,
    health_when,
    offline_result,
    run_bounded,
)

pytestmark = [pytest.mark.stress, pytest.mark.slow]


# -- overload ------------------------------------------------------------------------------------------
MAX_NUM_SEQS = 16
MAX_WAITING = 64
NUM_CLIENTS = 200


def overload_payload(i: int) -> dict[str, Any]:
    prompt = f"Client {i} asks: " + " ".join(["what", "is", "the", "weather", "like", "today"][: 1 + i % 6])
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": 8 + i % 17, "ignore_eos": i % 3 != 0}
    if i % 2:
        body.update(temperature=0.9, top_p=0.95, seed=1000 + i)
    else:
        body.update(temperature=0.0)
    return body


def test_http_overload_200_clients_against_a_queue_of_64(tiny: Path, tmp_path: Path, offline, reliability) -> None:
    """200 clients, each on its own connection, post at once while the engine holds still: 16 seats plus
    64 queued are admitted, the other 120 refused at once with 429 and Retry-After; every admitted one
    completes with the text the offline engine gives it alone."""
    config = config_with(BASE_CONFIG, max_num_seqs=MAX_NUM_SEQS, max_waiting=MAX_WAITING,
                         server__max_streams_per_client=NUM_CLIENTS + 56)
    d = DaemonProcess(tmp_path, tiny, config, http_listen="127.0.0.1:0")
    try:
        async def go():
            clients = [httpx.AsyncClient(base_url=d.http_url, timeout=180) for _ in range(NUM_CLIENTS)]
            ended: dict[int, float] = {}
            try:
                d.stall()
                sent_at = time.monotonic()

                async def one(i: int) -> httpx.Response:
                    r = await clients[i].post("/v1/completions", json=overload_payload(i))
                    ended[i] = time.monotonic()
                    return r
                calls = [asyncio.ensure_future(one(i)) for i in range(NUM_CLIENTS)]
                excess = NUM_CLIENTS - MAX_NUM_SEQS - MAX_WAITING
                while sum(c.done() for c in calls) < excess and time.monotonic() < sent_at + 60:
                    await asyncio.sleep(0.01)
                refused_while_held = sum(c.done() for c in calls)
                resumed_at = time.monotonic()
                d.resume()
                results = await asyncio.gather(*calls)
                return sent_at, resumed_at, refused_while_held, results, ended
            finally:
                await asyncio.gather(*[c.aclose() for c in clients])

        sent_at, resumed_at, refused_while_held, results, ended = run_bounded(go())
        admitted = [i for i, r in enumerate(results) if r.status_code == 200]
        refused = [i for i, r in enumerate(results) if r.status_code == 429]
        others = [(i, r.status_code, r.text[:200]) for i, r in enumerate(results) if i not in admitted + refused]
        assert not others, others[:5]
        assert len(admitted) == MAX_NUM_SEQS + MAX_WAITING and len(refused) == NUM_CLIENTS - len(admitted)
        assert refused_while_held == len(refused) and all(ended[i] < resumed_at for i in refused)
        for i in refused:
            err = results[i].json()["error"]
            assert err["type"] == "rate_limit_error" and err["message"].startswith("queue full")
            assert int(results[i].headers["retry-after"]) >= 1
        for i in admitted:
            p = overload_payload(i)
            want = offline_result(offline, p.pop("prompt"), **p)
            assert results[i].json()["choices"][0]["text"] == want.text, f"client {i}"
        h = assert_sound(d, offline)
        reliability("http_overload", clients=NUM_CLIENTS, queue_bound=MAX_WAITING, seats=MAX_NUM_SEQS,
                    admitted=len(admitted), refused_429=len(refused), other_outcomes=len(others),
                    completed=len(admitted), equal_to_offline=len(admitted), hung=0,
                    slowest_refusal_ms=round(1000 * (max(ended[i] for i in refused) - sent_at)),
                    leaked_pages=h.pages_total - h.pages_free - h.pages_cached)
    finally:
        d.stop()


# -- churn ---------------------------------------------------------------------------------------------
NUM_CHURN = 1000
WARMUP = 100
IN_FLIGHT = 24
KILLED = 3                    # client processes killed with SIGKILL while holding streams
STREAMS_PER_KILLED = 10
KINDS = ("complete", "stream", "disconnect", "timeout")
WEIGHTS = (30, 20, 30, 20)

KILLED_CLIENT = textwrap.dedent("""
    import asyncio, json, sys
    import httpx2 as httpx

    async def main(url, n, tag):
        async with httpx.AsyncClient(base_url=url, timeout=None) as client:
            body = lambda i: {"prompt": f"killed client {tag} stream {i}", "max_tokens": 200, "ignore_eos": True,
                              "temperature": 0, "stream": True}
            streams = [client.stream("POST", "/v1/completions", json=body(i)) for i in range(n)]
            responses = [await s.__aenter__() for s in streams]
            for r in responses:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        break
            print("streaming", flush=True)
            await asyncio.sleep(3600)

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
""")


@dataclass
class Churn:
    outcomes: dict = field(default_factory=dict)

    def count(self, what: str) -> None:
        self.outcomes[what] = self.outcomes.get(what, 0) + 1


async def churn_one(client: httpx.AsyncClient, url: str, rng: random.Random, i: int, tally: Churn) -> None:
    kind = rng.choices(KINDS, WEIGHTS)[0]
    body = {"prompt": f"churn {i} " + "word " * rng.randint(0, 40), "max_tokens": rng.randint(1, 32),
            "temperature": rng.choice([0.0, 0.8]), "seed": i, "ignore_eos": rng.random() < 0.5}
    if kind == "complete":
        r = await client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        tally.count("completed")
    elif kind == "stream":
        async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]", lines[-3:]
        tally.count("streamed")
    elif kind == "disconnect":     # leaves after a few chunks, closing its own connection
        async with httpx.AsyncClient(base_url=url, timeout=120) as own:
            async with own.stream("POST", "/v1/completions",
                                  json={**body, "max_tokens": 120, "ignore_eos": True, "stream": True}) as r:
                assert r.status_code == 200, await r.aread()
                seen = 0
                async for line in r.aiter_lines():
                    seen += line.startswith("data: ")
                    if seen > rng.randint(0, 3):
                        break
        tally.count("disconnected")
    else:                          # a client-side timeout: the request is dropped mid-way
        async with httpx.AsyncClient(base_url=url, timeout=rng.uniform(0.005, 0.3)) as own:
            try:
                await own.post("/v1/completions", json={**body, "max_tokens": 64})
                tally.count("timeout met")
            except httpx.TimeoutException:
                tally.count("timeout passed")


async def churn(url: str, start: int, n: int, seed: int, tally: Churn) -> None:
    rng = random.Random(seed)
    gate = asyncio.Semaphore(IN_FLIGHT)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=IN_FLIGHT)) as shared:
        async def one(i: int) -> None:
            async with gate:
                await churn_one(shared, url, random.Random(rng.random()), i, tally)
        await asyncio.gather(*[one(i) for i in range(start, start + n)])


def killed_clients(url: str, tally: Churn) -> None:
    for k in range(KILLED):
        p = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, url, str(STREAMS_PER_KILLED), str(k)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out = p.stdout
        assert out is not None                      # stdout=PIPE
        try:
            line = out.readline()
            assert line.strip() == "streaming", line + out.read()
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait()
            out.close()
        for _ in range(STREAMS_PER_KILLED):
            tally.count("client killed")


def test_http_churn_leaks_nothing(tiny: Path, tmp_path: Path, offline, reliability) -> None:
    """1,000 HTTP requests of which most disconnect mid-stream, time out or die with their process:
    every page comes back, the per-client stream count comes back to zero, the resident set stays
    within 5% of its size after warm-up, and the daemon still answers the reference request."""
    config = config_with(BASE_CONFIG, max_num_seqs=MAX_NUM_SEQS, max_waiting=MAX_WAITING)
    d = DaemonProcess(tmp_path, tiny, config, http_listen="127.0.0.1:0")
    try:
        tally = Churn()
        run_bounded(churn(d.http_url, 0, WARMUP, 1, tally))
        health_when(d.address, lambda h: h.running == 0 and h.waiting == 0, "warm-up to settle", 30)
        rss_warm = d.rss()
        t0 = time.monotonic()
        rest = NUM_CHURN - WARMUP - KILLED * STREAMS_PER_KILLED
        run_bounded(churn(d.http_url, WARMUP, rest // 2, 2, tally))
        killed_clients(d.http_url, tally)
        run_bounded(churn(d.http_url, WARMUP + rest // 2, rest - rest // 2, 3, tally))
        churn_s = time.monotonic() - t0
        h = assert_sound(d, offline)
        rss_end = d.rss()
        assert sum(tally.outcomes.values()) == NUM_CHURN

        # The per-client count is back to zero: the default limit of 64 admits exactly 64 more.
        async def at_the_limit():
            async with httpx.AsyncClient(base_url=d.http_url, timeout=120,
                                         limits=httpx.Limits(max_connections=80)) as client:
                d.stall()
                calls = [asyncio.ensure_future(client.post("/v1/completions", json={
                    "prompt": f"limit {i}", "max_tokens": 8, "ignore_eos": True, "temperature": 0}))
                    for i in range(64)]
                await asyncio.to_thread(health_when, d.address, lambda h: h.waiting >= 64, "the 64 requests queued", 30)
                extra = await client.post("/v1/completions", json={"prompt": "one more", "max_tokens": 2})
                d.resume()
                return extra, await asyncio.gather(*calls)
        extra, done = run_bounded(at_the_limit())
        assert extra.status_code == 429 and "server.max_streams_per_client" in extra.json()["error"]["message"]
        assert all(r.status_code == 200 for r in done)
        h = assert_sound(d, offline)
        drift = (rss_end - rss_warm) / rss_warm
        assert abs(drift) <= 0.05, f"resident set {rss_warm / 2**20:.1f} MiB -> {rss_end / 2**20:.1f} MiB"
        errors = [line for line in d.lines if line.startswith(("ERROR", "CRITICAL")) or "Traceback" in line]
        assert not errors, "\n".join(errors[:20])
        reliability("http_churn", requests=NUM_CHURN,
                    **{k.replace(" ", "_"): v for k, v in sorted(tally.outcomes.items())},
                    leaked_pages=h.pages_total - h.pages_free - h.pages_cached,
                    rss_after_warmup_mib=round(rss_warm / 2**20, 1), rss_end_mib=round(rss_end / 2**20, 1),
                    rss_drift_pct=round(100 * drift, 2),
                    admitted=sum("admitted over HTTP" in line for line in d.lines),
                    refused=sum("refused:" in line for line in d.lines),
                    body_cut=sum("before sending the whole body" in line for line in d.lines),
                    finished=sum("finished over HTTP" in line for line in d.lines),
                    aborted_in_engine=sum("request aborted" in line for line in d.lines),
                    churn_s=round(churn_s, 1))
    finally:
        d.stop()
