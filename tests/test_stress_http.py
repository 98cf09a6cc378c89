"""The stress group over the HTTP API: bad input (fuzz), overload against the queue bound, and churn
(disconnects, client timeouts, killed clients) against leaks, against the real daemon on loopback.

The same rules as the gRPC stress tests (test_stress_fuzz.py, test_stress_load.py): requests are held in
flight by holding the engine loop still, never by timing; zero crashes (no 5xx, no ERROR line or
traceback in the daemon's log); every page free or cached at the end and the reference request
answered as before. Figures go to the reliability record (RELIABILITY.md quotes them).
"""

from __future__ import annotations

import asyncio
import json
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
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from daemon_util import (BASE_CONFIG, ROOT, DaemonProcess, assert_sound, config_with, health_when, offline_result,
                         run_bounded)
from nvllm import SamplingParams

pytestmark = [pytest.mark.stress, pytest.mark.slow]

MODEL = "tiny-llama"
VOCAB = 512
MAX_STOP_STRINGS = 4
BATCH = 25
NUM_BATCHES = 80             # 2,000 bodies
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
CONFIG = config_with(BASE_CONFIG, max_stop_strings=MAX_STOP_STRINGS, http__max_body_bytes=16384)


# -- 1. bad input --------------------------------------------------------------------------------------
@dataclass
class Case:
    kind: str                     # good, bad, arbitrary
    path: str
    body: bytes
    expect: str = ""              # bad: the parameter the 400 (404 for model) must name
    what: str = ""
    payload: dict | None = None   # good: the JSON, to compare with the offline engine


# At most 20 characters (80 byte tokens at worst), two messages: every good prompt fits max_model_len 256.
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
SAMPLING = {
    "temperature": st.sampled_from([0, 0.0, 0.5, 1, 1.7]),
    "top_p": st.floats(0.05, 1.0), "top_k": st.integers(-1, 40), "min_p": st.floats(0.0, 0.5),
    "repetition_penalty": st.floats(0.8, 1.5), "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2), "seed": st.integers(0, 2**63), "ignore_eos": st.booleans(),
    "skip_special_tokens": st.booleans(), "include_stop_str_in_output": st.booleans(),
    "stop": st.lists(st.text(min_size=1, max_size=5), max_size=MAX_STOP_STRINGS) | st.text(min_size=1, max_size=5),
    "user": st.text(max_size=20), "min_tokens": st.integers(0, 2),
}


@st.composite
def good_payload(draw) -> tuple[str, dict[str, Any]]:
    path = draw(st.sampled_from([CHAT, COMPLETIONS]))
    body: dict[str, Any] = {"max_tokens": draw(st.integers(2, 12))}
    if path == CHAT:
        roles = draw(st.lists(st.sampled_from(["system", "user", "assistant"]), min_size=1, max_size=2))
        body["messages"] = [{"role": r, "content": draw(TEXT) if draw(st.booleans())
                             else [{"type": "text", "text": draw(TEXT)}]} for r in roles]
        if draw(st.booleans()):
            body["logprobs"] = True
            body["top_logprobs"] = draw(st.integers(0, 5))
    else:
        body["prompt"] = draw(TEXT | st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=30)
                              | st.lists(TEXT, min_size=1, max_size=2))
        if draw(st.booleans()):
            body["logprobs"] = draw(st.integers(0, 5))
    for name in draw(st.sets(st.sampled_from(sorted(SAMPLING)), max_size=6)):
        body[name] = draw(SAMPLING[name])
    if draw(st.integers(0, 3)) == 0:
        body["n"] = draw(st.integers(1, 3))
    if draw(st.booleans()):
        body["model"] = MODEL
    if draw(st.booleans()):
        body["stream"] = True
        if draw(st.booleans()):
            body["stream_options"] = {"include_usage": True}
    return path, body


# One defect each: (parameter, value); the 400 must name the parameter (404 for model).
DEFECTS: dict[str, st.SearchStrategy] = {
    "temperature": st.sampled_from([-1, "hot", True, [1], {"a": 1}]),
    "top_p": st.sampled_from([0, -0.1, 1.5, "1"]),
    "top_k": st.sampled_from([-2, 1.5, "3"]),
    "min_p": st.sampled_from([-0.1, 1.1]),
    "repetition_penalty": st.sampled_from([0, -1]),
    "presence_penalty": st.sampled_from([2.5, -3]),
    "frequency_penalty": st.sampled_from([2.5, -3]),
    "seed": st.sampled_from([-1, 2**64, 1.5, "7"]),
    "max_tokens": st.sampled_from([0, -5, 10**9, 1.5, "8"]),
    "n": st.sampled_from([0, 17, 1.5, "2"]),
    "stop": st.sampled_from([5, [1], [""], ["a"] * (MAX_STOP_STRINGS + 1), ["x" * 300]]),
    "stream": st.sampled_from(["yes", 1]),
    "logit_bias": st.sampled_from([{"5": 101}, {"five": 1}, {str(VOCAB): 1}, [5]]),
    "suffix": st.just("tail"),
    "unknown": st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=3, max_size=12),
    "model": st.sampled_from(["gpt-4o", "", "tiny-llama-x"]),
    "min_tokens": st.just(1000),
    "stop_token_ids": st.sampled_from([[-1], [VOCAB], "1"]),
}


@st.composite
def bad_case(draw) -> Case:
    path, body = draw(good_payload())
    name = draw(st.sampled_from(sorted(DEFECTS)))
    value = draw(DEFECTS[name])
    if name == "unknown":
        name = "x_" + value
        body[name] = 1
    elif name == "suffix" and path == CHAT:
        name, body["echo"] = "echo", True
    else:
        body[name] = value
    if name == "min_tokens":
        body["max_tokens"] = 4
    return Case("bad", path, json.dumps(body).encode(), expect=name, what=name)


@st.composite
def arbitrary_case(draw) -> Case:
    path = draw(st.sampled_from([CHAT, COMPLETIONS]))
    how = draw(st.sampled_from(["bytes", "cut", "json", "huge"]))
    if how == "bytes":
        body = draw(st.binary(max_size=200))
    elif how == "cut":
        _, good = draw(good_payload())
        text = json.dumps(good).encode()
        body = text[:draw(st.integers(0, max(0, len(text) - 1)))]
    elif how == "json":
        leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10)
        body = json.dumps(draw(st.recursive(leaf, lambda c: st.lists(c, max_size=4)
                                            | st.dictionaries(st.text(max_size=8), c, max_size=4),
                                            max_leaves=12))).encode()
    else:
        body = b'{"prompt": "' + b"a" * 20000 + b'"}'
    return Case("arbitrary", path, body, what=how)


@st.composite
def good_case(draw) -> Case:
    path, body = draw(good_payload())
    return Case("good", path, json.dumps(body).encode(), payload=body, what=path)


CASES = st.one_of(good_case(), bad_case(), arbitrary_case())


@dataclass
class Outcome:
    status: int
    text: str


async def send_all(client: httpx.AsyncClient, cases: list[Case]) -> list[Outcome]:
    async def one(c: Case) -> Outcome:
        r = await client.post(c.path, content=c.body, headers={"Content-Type": "application/json"})
        return Outcome(r.status_code, r.text)
    return await asyncio.gather(*[one(c) for c in cases])


def _choices_text(case: Case, out: Outcome) -> list[str] | None:
    """The choices' text of a served answer (streamed or whole), or None when malformed."""
    try:
        if case.payload.get("stream"):
            datas = [line[6:] for line in out.text.splitlines() if line.startswith("data: ")]
            if datas[-1] != "[DONE]":
                return None
            texts: dict[int, str] = {}
            for d in datas[:-1]:
                for c in json.loads(d)["choices"]:
                    piece = c.get("text") if case.path == COMPLETIONS else c["delta"].get("content")
                    texts[c["index"]] = texts.get(c["index"], "") + (piece or "")
            return [texts[i] for i in sorted(texts)]
        body = json.loads(out.text)
        return [c["text"] if case.path == COMPLETIONS else c["message"]["content"] for c in body["choices"]]
    except (ValueError, KeyError, IndexError, TypeError):
        return None


@dataclass
class Tally:
    counts: dict = field(default_factory=lambda: {"tried": 0, "served": 0, "refused": 0, "good": 0, "bad": 0,
                                                  "arbitrary": 0})
    statuses: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)
    compare: list = field(default_factory=list)       # (payload, path, texts) of greedy or seeded answers

    def check(self, cases: list[Case], outcomes: list[Outcome]) -> None:
        for case, out in zip(cases, outcomes):
            c = self.counts
            c["tried"] += 1
            c[case.kind] += 1
            self.statuses[out.status] = self.statuses.get(out.status, 0) + 1
            why = None
            if out.status >= 500:
                why = f"status {out.status}"
            elif case.kind == "good":
                texts = _choices_text(case, out) if out.status == 200 else None
                if texts is None:
                    why = f"not served: {out.status} {out.text[:300]}"
                else:
                    p = case.payload
                    if p.get("temperature") == 0 or "seed" in p:
                        self.compare.append((case.path, p, texts))
            elif case.kind == "bad":
                want = 404 if case.expect == "model" else 400
                try:
                    err = json.loads(out.text)["error"]
                except (ValueError, KeyError, TypeError):
                    err = {}
                if out.status != want or err.get("param") != case.expect:
                    why = f"expected {want} naming {case.expect}, got {out.status} {out.text[:300]}"
            else:
                if out.status not in (200, 400, 404, 413):
                    why = f"status {out.status}: {out.text[:300]}"
            if why is None:
                c["served" if out.status == 200 else "refused"] += 1
            else:
                self.failures.append(f"{case.kind} ({case.what}): {why}\n{case.body[:500]!r}")


def offline_texts(offline, path: str, p: dict[str, Any]) -> list[str]:
    names = {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
             "seed", "ignore_eos", "skip_special_tokens", "include_stop_str_in_output", "stop", "min_tokens",
             "max_tokens"}
    params = {k: v for k, v in p.items() if k in names}
    if path == CHAT:
        prompts: list[Any] = [{"messages": [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str)
                                             else "\n".join(part["text"] for part in m["content"])}
                                            for m in p["messages"]]}]
    else:
        prompt = p["prompt"]
        prompts = [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else list(prompt)
    n = p.get("n", 1)
    out = []
    for prompt in prompts:
        for i in range(n):
            q = dict(params)
            if "seed" in q and i:
                q["seed"] += i
            out.append(offline.generate([prompt], SamplingParams(**q))[0].text)
    return out


def test_http_fuzz_every_body_is_served_or_refused_naming_the_parameter(tiny_models: dict[str, Path],
                                                                        tmp_path: Path, offline, reliability) -> None:
    d = DaemonProcess(tmp_path, tiny_models[MODEL], CONFIG, http_listen="127.0.0.1:0")
    tally = Tally()
    t0 = time.monotonic()
    try:
        @settings(max_examples=NUM_BATCHES, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck), phases=[Phase.generate])
        @given(st.lists(CASES, min_size=BATCH, max_size=BATCH))
        def batch(cases: list[Case]) -> None:
            if tally.failures or d.proc.poll() is not None:
                return

            async def go() -> list[Outcome]:
                async with httpx.AsyncClient(base_url=d.http_url, timeout=120) as client:
                    return await send_all(client, cases)
            tally.check(cases, run_bounded(go()))

        batch()
        assert d.proc.poll() is None, "the daemon died:\n" + d.log()[-4000:]
        assert not tally.failures, f"{len(tally.failures)} wrong answers; the first:\n" + "\n\n".join(tally.failures[:5])
        seconds = time.monotonic() - t0
        for path, payload, texts in tally.compare:
            assert texts == offline_texts(offline, path, payload), (path, payload)
        errors = [line for line in d.lines if line.startswith(("ERROR", "CRITICAL")) or "Traceback" in line]
        assert not errors, "\n".join(errors[:20])
        h = assert_sound(d, offline)
        c = tally.counts
        reliability("http_bad_input", tried=c["tried"], served=c["served"], refused_4xx=c["refused"],
                    other_outcomes=c["tried"] - c["served"] - c["refused"], good=c["good"], bad=c["bad"],
                    arbitrary=c["arbitrary"], statuses={str(k): v for k, v in sorted(tally.statuses.items())},
                    compared_with_offline=len(tally.compare), crashes=0, error_log_lines=len(errors),
                    leaked_pages=h.pages_total - h.pages_free - h.pages_cached, seconds=round(seconds, 1))
    finally:
        d.stop()


# -- 2. overload ---------------------------------------------------------------------------------------
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


# -- 3. churn ------------------------------------------------------------------------------------------
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
        try:
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line.strip() == "streaming", line + p.stdout.read()
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait()
            p.stdout.close()
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
