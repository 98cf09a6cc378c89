"""The drone's query, end to end through a running daemon's HTTP API (`nvllm bench --query URL`).

The application this daemon exists for asks short questions under a long, fixed system prompt: here a
190-token prompt whose first 176 tokens (eleven 16-token pages) the prefix cache already holds, and a
20-token answer, timed from sending the request to holding the whole answer. The prompt is token ids
(/v1/completions takes them), so it has those lengths on every model; the system prompt is sent once
first, so its pages are cached as an application's would be after its first question.

The daemon's /metrics, read before and after the timed questions, split their mean time to first token
into its parts: the engine's queue, the prefill of the uncached tail (to the first token), what came
before the engine (parsing, tokenizing, admission, the hand-over), and then the first decode step.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np

SYSTEM_TOKENS, QUESTION_TOKENS, ANSWER_TOKENS = 176, 14, 20
_IDS = (10, 500)   # token ids every model's vocabulary holds, the tiny test models' too


class QueryError(Exception):
    """The daemon refused or failed a request; the message says which and why."""


def _post(url: str, body: dict[str, Any], api_key: str, timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(url.rstrip("/") + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {api_key}"} if api_key else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raise QueryError(f"{url}: HTTP {e.code}: {e.read().decode(errors='replace')[:300]}") from e
    except (urllib.error.URLError, OSError) as e:
        raise QueryError(f"{url}: {getattr(e, 'reason', e)}") from e


# The histograms whose sums and counts split the time to first token (server/metrics.py), by part.
SPLIT = {"ttft": "vllm:time_to_first_token_seconds", "queue": "vllm:request_queue_time_seconds",
         "prefill": "vllm:request_prefill_time_seconds", "first_decode": "nvllm:request_first_decode_seconds"}


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


def ttft_split(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Mean milliseconds of each part over the requests between two readings (parts no request fed left
    out); "before_engine" is the time to first token less the engine's queue and prefill."""
    out = {}
    for part in SPLIT:
        n = after[part][1] - before[part][1]
        if n > 0:
            out[part + "_ms"] = round((after[part][0] - before[part][0]) / n * 1e3, 2)
    if {"ttft_ms", "queue_ms", "prefill_ms"} <= set(out):
        out["before_engine_ms"] = round(out["ttft_ms"] - out["queue_ms"] - out["prefill_ms"], 2)
    return out


def drone_query(url: str, repeats: int = 5, api_key: str = "", timeout: float = 120.0,
                seed: int = 0) -> dict[str, Any]:
    """Times `repeats` questions under one cached system prompt; returns the figures (seconds)."""
    rng = np.random.default_rng(seed)
    system = rng.integers(*_IDS, SYSTEM_TOKENS).tolist()

    def ask(question: list[int], max_tokens: int) -> tuple[float, dict[str, Any]]:
        body = {"prompt": system + question, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        t0 = time.perf_counter()
        out = _post(url, body, api_key, timeout)
        return time.perf_counter() - t0, out

    ask(rng.integers(*_IDS, QUESTION_TOKENS).tolist(), 1)   # the system prompt's pages into the cache
    before = _metrics(url, timeout)
    times, cached = [], []
    for _ in range(repeats):
        seconds, out = ask(rng.integers(*_IDS, QUESTION_TOKENS).tolist(), ANSWER_TOKENS)
        usage = out.get("usage", {})
        if usage.get("completion_tokens") != ANSWER_TOKENS:
            raise QueryError(f"{url}: asked for {ANSWER_TOKENS} tokens, got usage {usage}")
        times.append(seconds)
        cached.append(int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)))
    after = _metrics(url, timeout) if before is not None else None
    return {"prompt_tokens": SYSTEM_TOKENS + QUESTION_TOKENS, "cached_tokens": min(cached),
            "answer_tokens": ANSWER_TOKENS, "seconds_p50": round(float(np.median(times)), 4),
            "seconds_min": round(min(times), 4), "seconds_max": round(max(times), 4), "repeats": repeats,
            "ttft_split": ttft_split(before, after) if before is not None and after is not None else {}}


def format_query(r: dict[str, Any]) -> str:
    line = (f"drone query: {r['prompt_tokens']}-token prompt ({r['cached_tokens']} cached), "
            f"{r['answer_tokens']} tokens answered: p50 {r['seconds_p50'] * 1e3:.0f} ms, "
            f"min {r['seconds_min'] * 1e3:.0f} ms, max {r['seconds_max'] * 1e3:.0f} ms over {r['repeats']}")
    s = r.get("ttft_split") or {}
    if "ttft_ms" in s:
        parts = [f"{name} {s[key]:.1f}" for name, key in (("before the engine", "before_engine_ms"),
                 ("queue", "queue_ms"), ("prefill", "prefill_ms")) if key in s]
        line += f"\n  time to first token {s['ttft_ms']:.1f} ms (mean): " + ", ".join(parts) + " ms"
        if "first_decode_ms" in s:
            line += f"; then the first decode step {s['first_decode_ms']:.1f} ms"
    return line
