"""`nvllm bench --speculation`: one stream's time per output token with n-gram speculation (or a draft
model's, --draft-model) and without,
on the same engine in the same run, for a task that repeats its input (a JSON record rewritten with
one field changed; a log summarised with its lines quoted) and for free text, beside the weight-read
floor (every weight read once per step: the least a token can cost when decode is memory-bound).

Both runs are greedy, so their tokens are the same: speculation changes only how many steps they take.
The runs take turns, best of `repeats`, so that other work on the machine skews both alike.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from nvllm.bench.floors import machine_info, measure_bandwidth_gbs
from nvllm.bench.throughput import decoder
from nvllm.config import load_settings
from nvllm.engine.assembly.factory import build_engine
from nvllm.engine.llm_engine import LLMEngine
from nvllm.model.kernels import threads as kernel_threads
from nvllm.sampling_params import InvalidParameter, SamplingParams

RECORD = ('{"id": "wp-0147", "type": "waypoint", "lat": 60.16987, "lon": 24.93838, "alt_m": 120.0, '
          '"speed_mps": 8.5, "heading_deg": 274, "hold_s": 30, "camera": "nadir", "note": "survey north pier"}')
LOG = "\n".join([
    "12:00:01 INFO battery 87% voltage 24.6 V", "12:00:04 WARN gps hdop 2.4 above 2.0",
    "12:00:09 INFO waypoint wp-0146 reached", "12:00:15 WARN wind 9.1 m/s gusting 12.0 m/s",
    "12:00:22 ERROR telemetry link lost for 3.2 s", "12:00:25 INFO telemetry link restored",
    "12:00:31 WARN battery 79% below planned 82%", "12:00:40 INFO waypoint wp-0147 reached"])
TASKS: dict[str, list[dict[str, str]]] = {
    "rewrite JSON (repeats its input)": [
        {"role": "user", "content": "Rewrite this JSON record exactly, with alt_m changed to 150.0. "
                                    "Output only the JSON.\n" + RECORD}],
    "summarise a log, quoting lines": [
        {"role": "user", "content": "Here is a flight log. List every WARN and ERROR line, quoted exactly, "
                                    "one per line.\n" + LOG}],
    "free text": [
        {"role": "user", "content": "Write a short story about a lighthouse keeper who befriends a seagull."}],
}


def _run(engine: LLMEngine, messages: list[dict[str, str]], gen_len: int, speculate: bool
         ) -> tuple[float, int, int]:
    """One request alone: (seconds from its first token to its last, tokens after the first, steps)."""
    params = SamplingParams(temperature=0, max_tokens=gen_len, disable_speculation=not speculate)
    engine.add_request(f"spec-bench-{time.monotonic_ns()}", {"messages": messages}, params)
    first = last = 0.0
    tokens = steps = 0
    while engine.has_unfinished():
        outs = engine.step()
        now = time.perf_counter()
        new = sum(len(o.token_ids) for o in outs)
        if new and not first:
            first, tokens = now, new - 1
        elif new:
            tokens += new
            steps += 1
        last = now if new else last
    return last - first, tokens, steps


def bench_speculation(model_dir: Path, gen_len: int = 128, repeats: int = 3, threads: int = 0,
                      num_tokens: int = 4, draft_model: str | None = None) -> dict[str, Any]:
    kernel_threads.configure(threads)
    bandwidth = measure_bandwidth_gbs()
    engine = build_engine(load_settings(overrides={
        "model": {"path": str(model_dir), "threads": threads},
        "cache": {"enable_prefix_caching": False, "num_blocks": 64},
        "scheduler": {"max_num_seqs": 1, "max_model_len": 1024},   # or the model's own limit, if less
        "speculative": {"method": "draft" if draft_model else "ngram", "num_tokens": num_tokens,
                        "draft_model": draft_model or ""}}))
    w = decoder(engine).weights
    out: dict[str, Any] = {
        "machine": {**machine_info(), "threads": engine.threads},
        "model": {"path": str(model_dir), "weight_bytes": w.nbytes},
        "method": f"draft model {draft_model}" if draft_model else "n-gram",
        "weight_read_ms": round(w.nbytes / bandwidth / 1e6, 3), "num_tokens": num_tokens, "tasks": []}
    _run(engine, TASKS["free text"], 8, True)   # warm-up
    for name, messages in TASKS.items():
        best: dict[bool, tuple[float, int, int]] = {}
        before = engine.speculator.stats()
        try:
            engine.make_sequence("fits", {"messages": messages}, SamplingParams(max_tokens=gen_len))
        except InvalidParameter as e:   # a small model's context
            out["tasks"].append({"task": name, "skipped": str(e)})
            continue
        for _ in range(repeats):
            for speculate in (False, True):
                s, n, steps = _run(engine, messages, gen_len, speculate)
                if n and (speculate not in best or s / n < best[speculate][0] / best[speculate][1]):
                    best[speculate] = (s, n, steps)
        after = engine.speculator.stats()
        proposed = after["spec_draft_tokens"] - before["spec_draft_tokens"]
        accepted = after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
        (s0, n0, steps0), (s1, n1, steps1) = best[False], best[True]
        out["tasks"].append({
            "task": name, "tokens": n1, "steps_without": steps0, "steps_with": steps1,
            "itl_ms_without": round(1000 * s0 / n0, 2), "itl_ms_with": round(1000 * s1 / n1, 2),
            "speedup": round((s0 / n0) / (s1 / n1), 2),
            "acceptance_rate": round(accepted / proposed, 3) if proposed else 0.0})
    # What a step of n decode rows cost, as the speculator measured it (its price list)
    out["step_ms_by_rows"] = {n: round(1000 * c, 2) for n, c in enumerate(engine.speculator.costs.seconds)
                              if c is not None}
    return out


def format_speculation(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [f"machine: {m['cpu']} ({m['arch']}, {m['cores']} cores), {m['threads']} threads",
             f"model: {r['model']['path']} ({r['model']['weight_bytes'] / 2**20:.0f} MiB of weights, read in "
             f"{r['weight_read_ms']} ms at this machine's bandwidth); {r.get('method', 'n-gram')} speculation, "
             f"{r['num_tokens']} tokens proposed at most, one greedy stream",
             "",
             f"{'task':<34} {'tokens':>6} {'ITL without':>11} {'ITL with':>9} {'speed-up':>8} {'steps':>11} "
             f"{'accepted':>8}"]
    for t in r["tasks"]:
        if "skipped" in t:
            lines.append(f"{t['task']:<34} skipped: {t['skipped']}")
            continue
        lines.append(f"{t['task']:<34} {t['tokens']:>6} {t['itl_ms_without']:>9}ms {t['itl_ms_with']:>7}ms "
                     f"{t['speedup']:>7}x {t['steps_without']:>4} -> {t['steps_with']:<4} "
                     f"{100 * t['acceptance_rate']:>7.0f}%")
    costs = r.get("step_ms_by_rows") or {}
    if costs:
        lines += ["", "a decode step by its rows (as the speculator measured it): " + ", ".join(
            f"{n}: {ms} ms" for n, ms in costs.items())]
    return "\n".join(lines)
