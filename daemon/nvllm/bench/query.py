"""The drone's query, end to end through a running daemon (`nvllm bench --query URL[,URL...]`).

The application this daemon exists for asks short questions under a long, fixed system prompt: here a
351-token prompt whose first 320 tokens (twenty 16-token pages) the prefix cache already holds, and a
20-token answer, streamed and timed from sending the request to holding each token. The prompt is token
ids (/v1/completions and gRPC's Generate take them), so it has those lengths on every model; the system
prompt is sent once first, so its pages are cached as an application's would be after its first question.
Each URL is one front door: http://HOST:PORT (the HTTP API, streamed as server-sent events) or
grpc://HOST:PORT (Generate's stream).

Where the time goes, per question: before the first token the engine's queue, the prefill of the uncached
tail and what came before the engine (parsing, tokenizing, admission, the hand-over); after it, each decode
step as the engine ran it, as the front door received it and as the client did, the difference between the
client's gap and the engine's step being the delivery (the hand-over to the event loop, the wire format,
the socket). The server's parts are read from the daemon's /metrics (an HTTP URL's, also for a gRPC URL
given beside it) before and after the timed questions. With `--model` the same file's decode runs in this
process afterwards on the same threads (the daemon idle): the daemon's tokens per second are then given
as a share of the bench's.
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np

SYSTEM_TOKENS, QUESTION_TOKENS, ANSWER_TOKENS = 320, 31, 20
_IDS = (10, 500)   # token ids every model's vocabulary holds, the tiny test models' too


class QueryError(Exception):
    """The daemon refused or failed a request; the message says which and why."""


@dataclass(frozen=True)
class Answer:
    """One streamed answer as the client saw it: seconds from sending the request."""
    first_s: float     # to the first token
    last_s: float      # to the last
    tokens: int
    cached: int        # prompt tokens the prefix cache held (the daemon's count)


def _url(target: str) -> urllib.parse.SplitResult:
    u = urllib.parse.urlsplit(target)
    if u.scheme not in ("http", "grpc") or not u.hostname or u.port is None:
        raise QueryError(f"--query: {target!r}: need http://HOST:PORT (the HTTP API) or grpc://HOST:PORT")
    return u


def _ask_http(target: str, ids: list[int], max_tokens: int, api_key: str, timeout: float) -> Answer:
    u = _url(target)
    body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=timeout)
    first = last = None
    usage: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", json.dumps(body), headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise QueryError(f"{target}: HTTP {resp.status}: {resp.read().decode(errors='replace')[:300]}")
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if "error" in chunk:
                raise QueryError(f"{target}: the stream failed: {chunk['error']}")
            if chunk.get("choices"):   # text (held back only while a character is incomplete) or the last one
                last = time.perf_counter() - t0
                first = last if first is None else first
            usage = chunk.get("usage") or usage
    except (OSError, http.client.HTTPException) as e:
        raise QueryError(f"{target}: {e}") from e
    finally:
        conn.close()
    if first is None or last is None or not usage:
        raise QueryError(f"{target}: the stream ended without tokens or usage")
    return Answer(first, last, int(usage.get("completion_tokens", 0)),
                  int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)))


class _Grpc:
    """One channel to a daemon's gRPC API, asked as the HTTP client is."""

    def __init__(self, target: str, timeout: float) -> None:
        import grpc

        from nvllm.v1 import nvllm_pb2, nvllm_pb2_grpc
        u = _url(target)
        self.pb, self.grpc, self.target, self.timeout = nvllm_pb2, grpc, target, timeout
        self.channel = grpc.insecure_channel(f"{u.hostname}:{u.port}")
        self.stub = nvllm_pb2_grpc.GeneratorStub(self.channel)

    def ask(self, ids: list[int], max_tokens: int) -> Answer:
        pb = self.pb
        req = pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=ids), sampling_params=pb.SamplingParams(
            temperature=0, max_tokens=max_tokens, ignore_eos=True))
        first = last = None
        tokens = cached = 0
        try:
            t0 = time.perf_counter()
            for msg in self.stub.Generate(req, timeout=self.timeout):
                if msg.token_ids:
                    last = time.perf_counter() - t0
                    first = last if first is None else first
                    tokens += len(msg.token_ids)
                if msg.HasField("usage"):
                    cached = msg.usage.cached_tokens
        except self.grpc.RpcError as e:
            raise QueryError(f"{self.target}: {e.code().name}: {e.details()}") from e
        if first is None or last is None:
            raise QueryError(f"{self.target}: the stream ended without tokens")
        return Answer(first, last, tokens, cached)

    def close(self) -> None:
        self.channel.close()


# The histograms whose sums and counts split a question's time, by part (server/metrics.py).
SPLIT = {"ttft": "vllm:time_to_first_token_seconds", "queue": "vllm:request_queue_time_seconds",
         "prefill": "vllm:request_prefill_time_seconds", "first_decode": "nvllm:request_first_decode_seconds",
         "itl": "vllm:inter_token_latency_seconds", "step": "nvllm:engine_step_seconds"}


def histogram_totals(text: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of each SPLIT histogram in a Prometheus text exposition (0 where absent)."""
    out = {}
    for part, name in SPLIT.items():
        got = {}
        for kind in ("sum", "count"):
            m = re.search(rf"^{re.escape(name)}_{kind}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
            got[kind] = float(m.group(1)) if m else 0.0
        out[part] = (got["sum"], got["count"])
    return out


def _metrics(url: str, timeout: float) -> dict[str, tuple[float, float]] | None:
    """The daemon's SPLIT totals now; None where it serves no /metrics."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout) as resp:
            return histogram_totals(resp.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError):
        return None


def server_split(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
                 ) -> dict[str, float]:
    """Mean milliseconds of each part over the requests between two readings (parts no request fed left
    out): "before_engine" is the time to first token less the engine's queue and prefill; "decode_step"
    the engine's steps after each request's prefill (all steps less one per request, their time less the
    prefills'); "front_door_gap" the gap between tokens as the front door received them."""
    delta = {part: (after[part][0] - before[part][0], after[part][1] - before[part][1]) for part in SPLIT}
    out = {}
    for part in ("ttft", "queue", "prefill", "first_decode"):
        total, n = delta[part]
        if n > 0:
            out[part + "_ms"] = round(total / n * 1e3, 2)
    if {"ttft_ms", "queue_ms", "prefill_ms"} <= set(out):
        out["before_engine_ms"] = round(out["ttft_ms"] - out["queue_ms"] - out["prefill_ms"], 2)
    if delta["itl"][1] > 0:
        out["front_door_gap_ms"] = round(delta["itl"][0] / delta["itl"][1] * 1e3, 2)
    steps, requests = delta["step"][1] - delta["prefill"][1], delta["prefill"][1]
    if requests > 0 and steps > 0:
        out["decode_step_ms"] = round((delta["step"][0] - delta["prefill"][0]) / steps * 1e3, 2)
    return out


def _front_door(target: str, repeats: int, api_key: str, timeout: float, system: list[int],
                rng: np.random.Generator, metrics_url: str | None) -> dict[str, Any]:
    """One front door's timed questions: the client's figures and the server's split."""
    grpc_client = _Grpc(target, timeout) if target.startswith("grpc:") else None

    def ask(question: list[int], max_tokens: int) -> Answer:
        if grpc_client is not None:
            return grpc_client.ask(system + question, max_tokens)
        return _ask_http(target, system + question, max_tokens, api_key, timeout)

    try:
        ask(rng.integers(*_IDS, QUESTION_TOKENS).tolist(), 1)   # the system prompt's pages into the cache
        before = _metrics(metrics_url, timeout) if metrics_url else None
        answers = []
        for _ in range(repeats):
            a = ask(rng.integers(*_IDS, QUESTION_TOKENS).tolist(), ANSWER_TOKENS)
            if a.tokens != ANSWER_TOKENS:
                raise QueryError(f"{target}: asked for {ANSWER_TOKENS} tokens, got {a.tokens}")
            answers.append(a)
        after = _metrics(metrics_url, timeout) if before is not None and metrics_url else None
    finally:
        if grpc_client is not None:
            grpc_client.close()
    seconds = [a.last_s for a in answers]
    gaps = [(a.last_s - a.first_s) / (a.tokens - 1) for a in answers]
    out: dict[str, Any] = {
        "front_door": "grpc" if grpc_client is not None else "http", "url": target,
        "cached_tokens": min(a.cached for a in answers),
        "seconds_p50": round(float(np.median(seconds)), 4), "seconds_min": round(min(seconds), 4),
        "seconds_max": round(max(seconds), 4),
        "first_token_ms_p50": round(float(np.median([a.first_s for a in answers])) * 1e3, 2),
        "client_gap_ms": round(float(np.mean(gaps)) * 1e3, 2),
        "decode_tokens_per_s": round(1.0 / float(np.mean(gaps)), 1),
        "split": server_split(before, after) if before is not None and after is not None else {}}
    if "decode_step_ms" in out["split"]:
        out["delivery_ms"] = round(out["client_gap_ms"] - out["split"]["decode_step_ms"], 2)
    return out


def drone_query(urls: str | list[str], repeats: int = 5, api_key: str = "", timeout: float = 120.0,
                seed: int = 0) -> dict[str, Any]:
    """Times `repeats` questions under one cached system prompt through each front door; returns the figures."""
    targets = [urls] if isinstance(urls, str) else list(urls)
    for t in targets:
        _url(t)
    metrics_url = next((t for t in targets if t.startswith("http:")), None)
    rng = np.random.default_rng(seed)
    system = rng.integers(*_IDS, SYSTEM_TOKENS).tolist()
    doors = [_front_door(t, repeats, api_key, timeout, system, rng, metrics_url) for t in targets]
    return {"prompt_tokens": SYSTEM_TOKENS + QUESTION_TOKENS, "answer_tokens": ANSWER_TOKENS, "repeats": repeats,
            "front_doors": doors}


def bench_decode_ms(engine: Any, repeats: int = 5, seed: int = 0) -> float:
    """The same question's decode in this process (an LLMEngine on the daemon's model and threads): the
    mean gap between its answer's tokens, in milliseconds."""
    from nvllm.bench.throughput import run_requests

    rng = np.random.default_rng(seed)
    system = rng.integers(*_IDS, SYSTEM_TOKENS).tolist()

    def question() -> list[int]:
        return system + rng.integers(*_IDS, QUESTION_TOKENS).tolist()

    run_requests(engine, [question()], 1)   # the system prompt's pages cached, as the daemon's are
    gaps: list[float] = []
    for _ in range(repeats):
        gaps += run_requests(engine, [question()], ANSWER_TOKENS)[2]
    return round(float(np.mean(gaps)) * 1e3, 2)


def format_query(r: dict[str, Any]) -> str:
    lines = []
    for d in r["front_doors"]:
        line = (f"drone query over {d['front_door']}: {r['prompt_tokens']}-token prompt ({d['cached_tokens']} cached), "
                f"{r['answer_tokens']} tokens answered: p50 {d['seconds_p50'] * 1e3:.0f} ms, "
                f"min {d['seconds_min'] * 1e3:.0f} ms, max {d['seconds_max'] * 1e3:.0f} ms over {r['repeats']}; "
                f"first token {d['first_token_ms_p50']:.1f} ms, then a token every {d['client_gap_ms']:.2f} ms "
                f"({d['decode_tokens_per_s']} tokens/s)")
        s = d.get("split") or {}
        if "ttft_ms" in s:
            parts = [f"{name} {s[key]:.1f}" for name, key in (("before the engine", "before_engine_ms"),
                     ("queue", "queue_ms"), ("prefill", "prefill_ms")) if key in s]
            line += f"\n  time to first token {s['ttft_ms']:.1f} ms (mean): " + ", ".join(parts) + " ms"
            if "first_decode_ms" in s:
                line += f"; then the first decode step {s['first_decode_ms']:.1f} ms"
        if "decode_step_ms" in s:
            gap = s.get("front_door_gap_ms", float("nan"))
            line += (f"\n  each token: the engine's decode step {s['decode_step_ms']:.2f} ms, at the front door every "
                     f"{gap:.2f} ms, at the client every {d['client_gap_ms']:.2f} ms: "
                     f"delivery {d['delivery_ms']:.2f} ms")
        if "bench_gap_ms" in r:
            line += (f"\n  the bench's decode of the same question {r['bench_gap_ms']:.2f} ms a token: the daemon at "
                     f"{r['bench_gap_ms'] / d['client_gap_ms']:.2f} of the bench's tokens/s")
        lines.append(line)
    return "\n".join(lines)
