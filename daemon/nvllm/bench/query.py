"""The drone's query, end to end through a running daemon's HTTP API (`nvllm bench --query URL`).

The application this daemon exists for asks short questions under a long, fixed system prompt: here a
190-token prompt whose first 176 tokens (eleven 16-token pages) the prefix cache already holds, and a
20-token answer, timed from sending the request to holding the whole answer. The prompt is token ids
(/v1/completions takes them), so it has those lengths on every model; the system prompt is sent once
first, so its pages are cached as an application's would be after its first question.
"""

from __future__ import annotations

import json
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
    times, cached = [], []
    for _ in range(repeats):
        seconds, out = ask(rng.integers(*_IDS, QUESTION_TOKENS).tolist(), ANSWER_TOKENS)
        usage = out.get("usage", {})
        if usage.get("completion_tokens") != ANSWER_TOKENS:
            raise QueryError(f"{url}: asked for {ANSWER_TOKENS} tokens, got usage {usage}")
        times.append(seconds)
        cached.append(int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)))
    return {"prompt_tokens": SYSTEM_TOKENS + QUESTION_TOKENS, "cached_tokens": min(cached),
            "answer_tokens": ANSWER_TOKENS, "seconds_p50": round(float(np.median(times)), 4),
            "seconds_min": round(min(times), 4), "seconds_max": round(max(times), 4), "repeats": repeats}


def format_query(r: dict[str, Any]) -> str:
    return (f"drone query: {r['prompt_tokens']}-token prompt ({r['cached_tokens']} cached), "
            f"{r['answer_tokens']} tokens answered: p50 {r['seconds_p50'] * 1e3:.0f} ms, "
            f"min {r['seconds_min'] * 1e3:.0f} ms, max {r['seconds_max'] * 1e3:.0f} ms over {r['repeats']}")
