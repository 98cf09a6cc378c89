"""Long prompts in flight at once against a running daemon, and what the daemon's resident set does.

    python tools/long_prompts.py --url http://127.0.0.1:8000 --pid PID [--streams 4] [--tokens 4096]

Sends `streams` completions at once over the HTTP API, each a prompt of about `tokens` tokens (random
words, measured with the daemon's own usage counts and scaled to fit) and a few tokens to generate,
then prints the daemon's peak resident set (VmHWM, which counts everything it ever held at once: the
weights, the page pool as it was backed, the forward scratch) and its resident set now. The prompts
differ from the first word, so no prefix cache can share them. This is issue "Prefill by integer
GEMM"'s check: the 0.5B shape's daemon, four streams of 4,096 tokens, peak RSS.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
import urllib.request
from pathlib import Path

WORDS = ("drone battery motor camera signal gimbal landing altitude compass wind checklist rotor frame "
         "payload mission waypoint return home sensor voltage current firmware propeller link telemetry").split()


def complete(url: str, prompt: str, max_tokens: int) -> dict:
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.load(r)


def prompt_of(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return f"Log {seed}: " + " ".join(rng.choice(WORDS) for _ in range(words))


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise ValueError(f"/proc/{pid}/status has no {field}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the daemon's HTTP API, e.g. http://127.0.0.1:8000")
    ap.add_argument("--pid", type=int, required=True, help="the daemon's process id, for its resident set")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=4096, help="prompt tokens per stream (about)")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens generated per stream")
    a = ap.parse_args()
    # Words per token for this model's vocabulary, from one short probe.
    probe = complete(a.url, prompt_of(0, 200), 1)["usage"]["prompt_tokens"]
    words = max(1, int((a.tokens - a.max_tokens) * 200 / probe))
    print(f"{probe} tokens for 200 words: {words} words a prompt; peak RSS before "
          f"{status_kib(a.pid, 'VmHWM') // 1024} MiB, RSS {status_kib(a.pid, 'VmRSS') // 1024} MiB")
    results: list[dict] = []
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results.append(complete(a.url, prompt_of(i + 1, words), a.max_tokens))
        except BaseException as e:  # reported below
            errors.append(e)

    t0 = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(a.streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"{len(errors)} of {a.streams} requests failed: {errors[0]}")
    tokens = [r["usage"]["prompt_tokens"] for r in results]
    print(f"{a.streams} streams of {min(tokens)}-{max(tokens)} prompt tokens in {time.monotonic() - t0:.1f} s; "
          f"peak RSS {status_kib(a.pid, 'VmHWM') // 1024} MiB, RSS now {status_kib(a.pid, 'VmRSS') // 1024} MiB")


if __name__ == "__main__":
    main()
