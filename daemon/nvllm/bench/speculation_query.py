"""`nvllm bench --speculation-query URL`: speculation measured where it is used, through a running daemon's
HTTP API (/v1/chat/completions), not in process: the same tasks as `--speculation` (bench/speculation.py), each
answered greedily with the request's `disable_speculation` false and true in turn on the same daemon, streamed
and not, so that every figure has its floor (the answer without proposals) from the same minutes.

Streamed, a token's time is the inter-token latency: from the first chunk to the last, over the tokens after
the first (what a voice assistant's listener waits for). Not streamed, it is the whole request over its tokens
(prefill included, what a caller waiting for the whole answer sees). The daemon's /metrics, read around each
task, give the proposals' acceptance. Both answers are greedy, so their text must be the same: the figures
say if it was not.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from typing import Any

from nvllm.bench.query import QueryError
from nvllm.bench.speculation import TASKS

_COUNTERS = {"drafted": "vllm:spec_decode_num_draft_tokens_total",
             "accepted": "vllm:spec_decode_num_accepted_tokens_total"}


def _request(url: str, body: dict[str, Any], api_key: str, timeout: float) -> urllib.request.Request:
    return urllib.request.Request(url.rstrip("/") + "/v1/chat/completions", data=json.dumps(body).encode(),
                                  headers={"Content-Type": "application/json",
                                           **({"Authorization": f"Bearer {api_key}"} if api_key else {})})


def ask(url: str, messages: list[dict[str, str]], gen_len: int, speculate: bool, stream: bool,
        api_key: str = "", timeout: float = 300.0) -> dict[str, Any]:
    """One greedy answer: {"seconds": request to last byte, "first_s": to the first content (streamed only),
    "last_s": to the last content, "tokens", "text"}."""
    body: dict[str, Any] = {"messages": messages, "max_tokens": gen_len, "temperature": 0,
                            "disable_speculation": not speculate, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    t0 = time.perf_counter()
    first = last = 0.0
    text: list[str] = []
    usage: dict[str, Any] = {}
    try:
        with urllib.request.urlopen(_request(url, body, api_key, timeout), timeout=timeout) as resp:
            if not stream:
                out = json.loads(resp.read())
                last = time.perf_counter() - t0
                text.append(out["choices"][0]["message"].get("content") or "")
                usage = out.get("usage") or {}
            for line in resp if stream else ():
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                piece = "".join((c.get("delta") or {}).get("content") or "" for c in chunk.get("choices") or ())
                if piece:
                    last = time.perf_counter() - t0
                    first = first or last
                    text.append(piece)
    except urllib.error.HTTPError as e:
        raise QueryError(f"{url}: HTTP {e.code}: {e.read().decode(errors='replace')[:300]}") from e
    except (urllib.error.URLError, OSError) as e:
        raise QueryError(f"{url}: {getattr(e, 'reason', e)}") from e
    return {"seconds": time.perf_counter() - t0, "first_s": first, "last_s": last,
            "tokens": int(usage.get("completion_tokens", 0)), "text": "".join(text)}


def ms_per_token(r: dict[str, Any], stream: bool) -> float | None:
    """Streamed: first content to last, per token after the first; whole: the request per token."""
    if stream:
        return 1e3 * (r["last_s"] - r["first_s"]) / (r["tokens"] - 1) if r["tokens"] > 1 else None
    return 1e3 * r["seconds"] / r["tokens"] if r["tokens"] else None


def _counters(url: str, timeout: float) -> dict[str, float]:
    """The daemon's proposal counters (0 where it does not speculate or serves no /metrics)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout) as resp:
            text = resp.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        text = ""
    out = {}
    for key, name in _COUNTERS.items():
        m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
        out[key] = float(m.group(1)) if m else 0.0
    return out


def bench_speculation_query(url: str, gen_len: int = 128, repeats: int = 3, api_key: str = "",
                            timeout: float = 300.0) -> dict[str, Any]:
    """Each task with proposals and without, streamed and whole, taking turns `repeats` times; the best
    time per token of each (other work on the machine only ever adds)."""
    ask(url, TASKS["free text"], 8, True, False, api_key, timeout)   # warm-up: the first step's costs measured
    out: dict[str, Any] = {"url": url, "gen_len": gen_len, "repeats": repeats, "tasks": []}
    for name, messages in TASKS.items():
        try:
            ask(url, messages, 1, False, False, api_key, timeout)
        except QueryError as e:   # a small model's context
            if "HTTP 400" not in str(e):
                raise
            out["tasks"].append({"task": name, "skipped": str(e)})
            continue
        before = _counters(url, timeout)
        best: dict[tuple[bool, bool], tuple[float, dict[str, Any]]] = {}
        for _ in range(repeats):
            for stream in (True, False):
                for speculate in (False, True):
                    r = ask(url, messages, gen_len, speculate, stream, api_key, timeout)
                    ms = ms_per_token(r, stream)
                    if ms is not None and ((stream, speculate) not in best or ms < best[stream, speculate][0]):
                        best[stream, speculate] = (ms, r)
        after = _counters(url, timeout)
        if len(best) < 4:
            out["tasks"].append({"task": name, "skipped": "answers of one token or none"})
            continue
        drafted = after["drafted"] - before["drafted"]
        row: dict[str, Any] = {
            "task": name, "tokens": best[True, True][1]["tokens"],
            "same_text": len({r["text"] for _, r in best.values()}) == 1,
            "acceptance_rate": round((after["accepted"] - before["accepted"]) / drafted, 3) if drafted else 0.0,
            "proposed_per_answer": round(drafted / (2 * repeats), 1)}
        for stream, kind in ((True, "stream"), (False, "whole")):
            (off, _), (on, _) = best[stream, False], best[stream, True]
            row[f"{kind}_ms_without"], row[f"{kind}_ms_with"] = round(off, 2), round(on, 2)
            row[f"{kind}_speedup"] = round(off / on, 2)
        row["first_token_ms_without"] = round(1e3 * best[True, False][1]["first_s"], 1)
        row["first_token_ms_with"] = round(1e3 * best[True, True][1]["first_s"], 1)
        out["tasks"].append(row)
    return out


def format_speculation_query(r: dict[str, Any]) -> str:
    lines = [f"daemon {r['url']}: each task's greedy answer (--gen-len {r['gen_len']} at most) with its proposals "
             f"and without (disable_speculation), best of {r['repeats']}; ms per token streamed (first token to "
             f"last) and whole (the request)",
             "",
             f"{'task':<34} {'tokens':>6} {'stream without':>14} {'with':>8} {'speed-up':>8} {'whole without':>13} "
             f"{'with':>8} {'speed-up':>8} {'accepted':>8}"]
    for t in r["tasks"]:
        if "skipped" in t:
            lines.append(f"{t['task']:<34} skipped: {t['skipped']}")
            continue
        lines.append(f"{t['task']:<34} {t['tokens']:>6} {t['stream_ms_without']:>12}ms {t['stream_ms_with']:>6}ms "
                     f"{t['stream_speedup']:>7}x {t['whole_ms_without']:>11}ms {t['whole_ms_with']:>6}ms "
                     f"{t['whole_speedup']:>7}x {100 * t['acceptance_rate']:>7.0f}%"
                     + ("" if t["same_text"] else "  (the answers differ!)"))
    return "\n".join(lines)
