"""An urgent query beside aged background streams against a running daemon: what the user waits for.

    nvllm serve --model models/smollm2-135m-instruct.gguf --threads 2 --http-listen 127.0.0.1:8000
    python tools/urgent_query.py --url http://127.0.0.1:8000 [--streams 32] [--tokens 160] [--age-steps 600]

Starts `streams` streaming completions of priority 0 over the HTTP API (`tokens` tokens each, EOS
ignored), waits until `age-steps` engine steps have passed (timed by the streams' own tokens; 600 by
default, past twice the default scheduler.priority_aging_steps, so the ones still queued have aged two
levels and more), then sends "Obstacle ahead?" as a streamed chat at priority -1. Prints its time to
first token (the first chunk of its stream, which comes with its first token); the daemon's step time
(the median gap between consecutive chunks of the background streams, a token a step each); the first
token in steps, as time (ttft / step) and as the engine steps that ran meanwhile (the most tokens one
background stream had in that time: the urgent query's own prefill makes its step longer than a decode
step); and, from the daemon's /metrics, its time to first token split into queueing and prefill.
Issue 50's check: at the default settings the urgent query's first token comes within 3 engine steps
however long the background work has waited. Talks only to this machine (127.0.0.1, localhost, ::1); at most 64
streams (the default scheduler.max_waiting) and --timeout-s seconds in all.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.parse
import urllib.request
from typing import Any

LOCAL = {"127.0.0.1", "localhost", "::1"}
URGENT = "Obstacle ahead?"
FIRST_TOKEN = {"vllm:time_to_first_token_seconds": "ttft", "vllm:request_queue_time_seconds": "queued",
               "vllm:request_prefill_time_seconds": "prefill"}


def stream(url: str, path: str, body: dict[str, Any], times: list[float], timeout: float) -> None:
    """POST a streamed request and append the arrival time of each chunk of it to `times`."""
    req = urllib.request.Request(url + path, json.dumps({**body, "stream": True}).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"{path}: {chunk['error']}")
            times.append(time.monotonic())


def first_token_metrics(url: str) -> dict[str, float]:
    """The daemon's time-to-first-token histograms (sum and count over its models, from GET /metrics):
    arrival to first token, and its parts, waiting in the engine's queue and prefill."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name.removesuffix("_sum").removesuffix("_count") in FIRST_TOKEN and name.endswith(("_sum", "_count")):
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the daemon's HTTP API on this machine")
    ap.add_argument("--streams", type=int, default=32, help="background streams of priority 0 (1-64)")
    ap.add_argument("--tokens", type=int, default=160, help="tokens each background stream generates")
    ap.add_argument("--age-steps", type=int, default=600,
                    help="engine steps the background runs and waits before the urgent query")
    ap.add_argument("--urgent-tokens", type=int, default=16, help="tokens of the urgent answer")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="the whole run's limit")
    a = ap.parse_args()
    host = urllib.parse.urlsplit(a.url).hostname
    if host not in LOCAL:
        ap.error(f"--url must be this machine's ({', '.join(sorted(LOCAL))}), not {host!r}")
    if not 1 <= a.streams <= 64 or not 1 <= a.tokens <= 4096 or a.age_steps < 0 or not 1 <= a.timeout_s <= 3600:
        ap.error("1 <= --streams <= 64, 1 <= --tokens <= 4096, 0 <= --age-steps, 1 <= --timeout-s <= 3600")
    url = a.url.rstrip("/")
    deadline = time.monotonic() + a.timeout_s
    errors: list[BaseException] = []
    times: list[list[float]] = [[] for _ in range(a.streams)]

    def run(path: str, body: dict[str, Any], into: list[float]) -> None:
        try:
            stream(url, path, body, into, max(1.0, deadline - time.monotonic()))
        except BaseException as e:  # reported below
            errors.append(e)

    background = [threading.Thread(target=run, daemon=True, args=("/v1/completions", {
        "prompt": f"Flight log {i}: summarize the battery, motor and wind readings of this mission.",
        "max_tokens": a.tokens, "temperature": 0, "ignore_eos": True, "priority": 0}, times[i]))
        for i in range(a.streams)]
    t0 = time.monotonic()
    for t in background:
        t.start()
    while not errors and time.monotonic() < deadline:
        gaps = [b - x for ts in times for x, b in zip(ts, ts[1:])]
        if len(gaps) > 16 and time.monotonic() - t0 >= a.age_steps * statistics.median(gaps):
            break
        time.sleep(0.05)
    if errors:
        raise SystemExit(f"a background stream failed: {errors[0]!r}")
    aged = time.monotonic() - t0
    waiting = sum(not ts for ts in times)
    done = sum(not t.is_alive() for t in background)
    if done == a.streams:
        raise SystemExit("every background stream ended before the urgent query: fewer --age-steps")

    urgent: list[float] = []
    before = first_token_metrics(url)
    sent = time.monotonic()
    run("/v1/chat/completions", {"messages": [{"role": "user", "content": URGENT}], "max_tokens": a.urgent_tokens,
                                 "temperature": 0, "priority": -1}, urgent)
    if errors or not urgent:
        raise SystemExit(f"the urgent query failed: {errors[0]!r}" if errors else "the urgent query had no chunk")
    after = first_token_metrics(url)
    for t in background:
        t.join(max(0.0, deadline - time.monotonic()))
    if errors:
        raise SystemExit(f"a background stream failed: {errors[0]!r}")
    if any(t.is_alive() for t in background):
        raise SystemExit(f"the background streams did not end within --timeout-s {a.timeout_s:g}")

    gaps = [b - x for ts in times for x, b in zip(ts, ts[1:])]
    step = statistics.median(gaps)
    ttft = urgent[0] - sent
    # Engine steps from the send to the first token, that one's included: the most tokens a background
    # stream that streamed all along had meanwhile (a token a step; half a step's grace for delivery order).
    along = [sum(sent < x <= urgent[0] + step / 2 for x in ts) for ts in times
             if ts and ts[0] < sent and ts[-1] > urgent[0]]
    steps = (f"{max(along)} engine steps (background tokens meanwhile)" if along
             else "engine steps not counted (no background stream ran all along)")
    print(f"{a.streams} background streams of {a.tokens} tokens; after {aged:.1f} s (~{aged / step:.0f} steps) "
          f"{waiting} had no token yet (waiting) and {done} had ended")
    print(f"urgent {URGENT!r} at priority -1: first token after {ttft * 1000:.0f} ms, answer in "
          f"{(urgent[-1] - sent) * 1000:.0f} ms; step {step * 1000:.1f} ms (median of {len(gaps)} gaps): "
          f"first token in {ttft / step:.1f} steps' time, {steps}")
    # The daemon's own figures for the urgent request, when it was the only first token meanwhile.
    firsts = {m: after.get(m + "_count", 0) - before.get(m + "_count", 0) for m in FIRST_TOKEN}
    if all(n == 1 for n in firsts.values()):
        print("in the daemon: " + ", ".join(f"{k} {(after[m + '_sum'] - before[m + '_sum']) * 1000:.0f} ms"
                                            for m, k in FIRST_TOKEN.items()))
    else:
        print(f"in the daemon: not told apart ({int(max(firsts.values()))} first tokens meanwhile)")


if __name__ == "__main__":
    main()
