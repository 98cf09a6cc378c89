"""Throughput and latency, each figure beside floors measured in the same run with the same BLAS
(bench_floors.py says what each floor is). Every figure is also given as a fraction of its floor (1.0 =
at the floor); bench_report.py lays the result out as a table.

`python -m nvllm.bench sampler` times sample() alone, on random logits, for a few parameter mixes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from nvllm.bench_floors import (
    Floors,
    floor_pass,
    machine_info,
    measure_bandwidth_gbs,
    measure_int_peak_gops,
    measure_sgemm_gflops,
    one_row_rates,
    weight_formats,
    weight_matmul_params,
)
from nvllm.bench_report import format_table
from nvllm.config import load_settings
from nvllm.engine.factory import build_engine, read_model_info
from nvllm.engine.llm_engine import LLMEngine
from nvllm.model.kernels import matmul, ops
from nvllm.model.kernels import threads as kernel_threads
from nvllm.model.sampling.batch import SamplingBatch
from nvllm.model.sampling.sampler import make_generator, sample
from nvllm.sampling_params import SamplingParams


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return float(np.percentile(np.asarray(values), q))


class Progress:
    """One status line on a terminal, rewritten in place; elsewhere only the phases, one per line."""

    def __init__(self, enabled: bool) -> None:
        self.tty = enabled and sys.stderr.isatty()
        self.quiet = not enabled

    def __call__(self, msg: str, tick: bool = False) -> None:
        if self.quiet or (tick and not self.tty):
            return
        if self.tty:
            sys.stderr.write("\r\033[K" + msg)
            sys.stderr.flush()
        else:
            print(msg, file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K")


def random_prompt(rng: np.random.Generator, vocab: int, n: int) -> list[int]:
    return rng.integers(100, min(vocab, 30000), n).tolist()


def run_requests(engine: LLMEngine, prompts: list[list[int]], gen_len: int
                 ) -> tuple[float, list[float], list[float], list[int]]:
    """Run prompts together to completion; returns (wall time, TTFTs, inter-token gaps, tokens per step)."""
    params = SamplingParams(temperature=0, max_tokens=gen_len, ignore_eos=True)
    start = time.perf_counter()
    ids = []
    for i, p in enumerate(prompts):
        rid = f"bench-{time.monotonic_ns()}-{i}"
        engine.add_request(rid, p, params)
        ids.append(rid)
    last: dict[str, float] = {}
    ttft, itl, steps = [], [], []
    while engine.has_unfinished():
        outs = engine.step()
        now = time.perf_counter()
        steps.append(len(outs))
        for o in outs:
            if not o.token_ids:
                continue
            if o.request_id not in last:
                ttft.append(now - start)
            else:
                itl.append(now - last[o.request_id])
            last[o.request_id] = now
    return time.perf_counter() - start, ttft, itl, steps


def bench_in_process(model_dir: Path, concurrency: list[int], prompt_len: int, gen_len: int,
                     prefill_lens: list[int], progress: Progress, threads: int = 0,
                     quantization: str | None = None, activations: str | None = None,
                     kv_cache_dtype: str | None = None) -> dict[str, Any]:
    rss_peak = [psutil.Process().memory_info().rss]

    def sample_rss() -> None:
        rss_peak[0] = max(rss_peak[0], psutil.Process().memory_info().rss)

    # the machine's floors first: their 256 MiB buffer is freed before the model loads, so it does not
    # become the process's peak resident memory (which is what an outside measure, /usr/bin/time, reads)
    progress("measuring the machine's floors")
    kernel_threads.configure(threads)
    bandwidth, sgemm = measure_bandwidth_gbs(), measure_sgemm_gflops()
    progress("loading model")
    max_c = max(concurrency)
    budget = max(512, max(prefill_lens))
    overrides: dict[str, Any] = {
        "model": {"path": str(model_dir), "threads": threads, "quantization": quantization,
                  "activations": activations},
        "cache": {"block_size": 16, "enable_prefix_caching": False, "dtype": kv_cache_dtype},
        "scheduler": {"max_num_seqs": max_c, "max_num_batched_tokens": budget,
                      "max_model_len": max(prompt_len + gen_len, max(prefill_lens)) + 1}}
    info = read_model_info(load_settings(overrides=overrides))   # pages per sequence follow the pool's groups
    overrides["cache"]["num_blocks"] = (max_c * info.blocks_for(prompt_len + gen_len, 16, budget)
                                        + 2 * info.blocks_for(max(prefill_lens), 16, budget) + 16)
    settings = load_settings(overrides=overrides)
    engine = build_engine(settings)
    mc = engine.model.config
    w = engine.model.weights
    sample_rss()
    body, head = weight_matmul_params(w)
    floors = Floors(bandwidth_gbs=bandwidth, sgemm_gflops=sgemm, weight_bytes=w.nbytes,
                    flops_per_token=2.0 * (body + head))
    head_flops = 2.0 * head
    rng = np.random.default_rng(0)
    result: dict[str, Any] = {
        "machine": {**machine_info(), "threads": engine.threads, "kernels": ops.describe(),
                    "matmul_kernels": matmul.describe()},
        "model": {"path": str(model_dir), "architecture": mc.architecture, "parameters": mc.num_params,
                  "layers": mc.num_layers, "hidden": mc.hidden_size, "vocab": mc.vocab_size,
                  "weight_bytes": w.nbytes, "weight_formats": weight_formats(w)},
        "floors": {"memory_bandwidth_gbs": round(floors.bandwidth_gbs, 2),
                   "sgemm_gflops": round(floors.sgemm_gflops, 1),
                   "weight_read_ms": round(floors.weight_bytes / floors.bandwidth_gbs / 1e6, 2)},
        "prefill": [], "decode": [],
    }
    # measured with the engine's threads and kernel variant in place (it sets them), before any request
    progress("measuring the integer peak and the one-row kernels")
    peak = measure_int_peak_gops(engine.threads)
    if peak is not None:
        result["floors"]["int_peak"] = {"variant": peak[0], "gops": round(peak[1], 1)}
    result["floors"]["one_row_gbs"] = {
        name: {"gbs": round(r, 2), "of_bandwidth": round(r / floors.bandwidth_gbs, 3)}
        for name, r in one_row_rates(w).items()}
    for n in prefill_lens:
        progress(f"prefill {n} tokens")
        prompt = random_prompt(rng, mc.vocab_size, n)
        run_requests(engine, [prompt], 1)  # warm-up
        times = []
        for _ in range(3):  # each run beside a fresh floor; best of each
            mm = floors.matmul(w, n, 1)
            times.append(run_requests(engine, [random_prompt(rng, mc.vocab_size, n)], 1)[0])
        t = min(times)
        sample_rss()
        roof = floors.roofline(n, 1, head_flops)
        result["prefill"].append({
            "prompt_tokens": n, "seconds": round(t, 6), "tokens_per_s": round(n / t, 1),
            "matmul_floor_s": round(mm, 6), "fraction_of_floor": round(mm / t, 3),
            "roofline_s": round(roof, 6), "fraction_of_roofline": round(roof / t, 3)})
    for c in concurrency:
        progress(f"decode at concurrency {c}")
        prompts = [random_prompt(rng, mc.vocab_size, prompt_len) for _ in range(c)]
        run_requests(engine, [p[:16] for p in prompts[:2]], 4)  # warm-up
        result["decode"].append(_decode_at(engine, floors, prompts, gen_len, head_flops, progress, sample_rss))
    result["peak_rss_mib"] = round(rss_peak[0] / 2**20, 1)
    progress.done()
    return result


def _decode_at(engine: LLMEngine, floors: Floors, prompts: list[list[int]], gen_len: int, head_flops: float,
               progress: Progress, sample_rss: Callable[[], None]) -> dict[str, Any]:
    """Decode with len(prompts) requests in flight: tokens/s, TTFT and ITL beside the matmul floor."""
    c = len(prompts)
    w = engine.model.weights
    # The floor is sampled between decode steps, one pass after every other step, so that it meets
    # the same moments of a drifting machine as the steps do; the two means are compared.
    floor_run, floor_samples = floor_pass(w, c, c), []
    floor_run()
    # Prefill everyone first, then time pure decode steps.
    params = SamplingParams(temperature=0, max_tokens=gen_len, ignore_eos=True)
    paused = 0.0  # time spent on floor passes, kept off the clock that TTFT and ITL are read from

    def clock() -> float:
        return time.perf_counter() - paused
    start = clock()
    for i, p in enumerate(prompts):
        engine.add_request(f"d{c}-{i}", p, params)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    itl: list[float] = []
    decode_time, decode_tokens, step_times = 0.0, 0, []
    while engine.has_unfinished():
        t0 = clock()
        outs = engine.step()
        now = clock()
        produced = [o for o in outs if o.token_ids]
        # A pure decode step: every sequence that produced a token had produced one before.
        pure = bool(produced) and all(o.request_id in first for o in produced)
        for o in produced:
            if o.request_id in first:
                itl.append(now - last[o.request_id])
            else:
                first[o.request_id] = now - start
            last[o.request_id] = now
        if pure:
            decode_time += now - t0
            decode_tokens += len(produced)
            step_times.append((now - t0, len(produced)))
            if len(step_times) % 2:
                f0 = time.perf_counter()
                floor_run()
                floor_samples.append(time.perf_counter() - f0)
                paused += floor_samples[-1]
        progress(f"decode at concurrency {c}: {len(last)} started, {decode_tokens} decode tokens", tick=True)
    sample_rss()
    tps = decode_tokens / decode_time if decode_time else float("nan")
    mm = float(np.mean(floor_samples)) if floor_samples else floors.matmul(w, c, c)
    roof = floors.roofline(c, c, head_flops)
    return {
        "concurrency": c, "tokens_per_s": round(tps, 1),
        "step_ms": round(1000 * decode_time / max(1, len(step_times)), 2),
        "matmul_floor_step_ms": round(1000 * mm, 2),
        "floor_tokens_per_s": round(c / mm, 1), "fraction_of_floor": round(tps * mm / c, 3),
        "roofline_tokens_per_s": round(c / roof, 1), "fraction_of_roofline": round(tps * roof / c, 3),
        "ttft_ms_p50": round(1000 * pct(list(first.values()), 50), 1),
        "ttft_ms_p99": round(1000 * pct(list(first.values()), 99), 1),
        "itl_ms_p50": round(1000 * pct(itl, 50), 2), "itl_ms_p99": round(1000 * pct(itl, 99), 2)}


async def _bench_target(target: str, concurrency: list[int], prompt_len: int, gen_len: int,
                        progress: Progress) -> dict[str, Any]:
    import grpc

    from nvllm.v1 import nvllm_pb2, nvllm_pb2_grpc

    result: dict[str, Any] = {"machine": machine_info(), "target": target, "decode": []}
    async with grpc.aio.insecure_channel(target) as channel:
        stub = nvllm_pb2_grpc.GeneratorStub(channel)
        health = await stub.Health(nvllm_pb2.HealthRequest(), timeout=10)
        result["model"] = {"name": health.model}
        rng = np.random.default_rng(0)

        async def one(ids: list[int], times: dict[str, Any]) -> int:
            req = nvllm_pb2.GenerateRequest(
                prompt_token_ids=nvllm_pb2.TokenIds(ids=ids),
                sampling_params=nvllm_pb2.SamplingParams(temperature=0, max_tokens=gen_len, ignore_eos=True))
            start = time.perf_counter()
            stamps = []
            n = 0
            async for resp in stub.Generate(req):
                if resp.token_ids:
                    stamps.append(time.perf_counter())
                    n += len(resp.token_ids)
            times["ttft"].append(stamps[0] - start)
            times["itl"].extend(b - a for a, b in zip(stamps, stamps[1:]))
            return n

        for c in concurrency:
            progress(f"decode at concurrency {c} through {target}")
            times: dict[str, list[float]] = {"ttft": [], "itl": []}
            t = time.perf_counter()
            counts = await asyncio.gather(*(one(rng.integers(100, 30000, prompt_len).tolist(), times)
                                            for _ in range(c)))
            wall = time.perf_counter() - t
            result["decode"].append({
                "concurrency": c, "tokens_per_s": round(sum(counts) / wall, 1),
                "ttft_ms_p50": round(1000 * pct(times["ttft"], 50), 1),
                "ttft_ms_p99": round(1000 * pct(times["ttft"], 99), 1),
                "itl_ms_p50": round(1000 * pct(times["itl"], 50), 2),
                "itl_ms_p99": round(1000 * pct(times["itl"], 99), 2)})
    progress.done()
    return result


def run(model_dir: Path | None, concurrency: list[int], prompt_len: int, gen_len: int,
        target: str | None, as_json: bool, prefill_lens: list[int] | None = None,
        threads: int = 0, quantization: str | None = None, activations: str | None = None,
        kv_cache_dtype: str | None = None) -> dict[str, Any]:
    progress = Progress(enabled=True)
    if target:
        result = asyncio.run(_bench_target(target, concurrency, prompt_len, gen_len, progress))
    else:
        assert model_dir is not None
        result = bench_in_process(model_dir, concurrency, prompt_len, gen_len, prefill_lens or [128, 512],
                                  progress, threads, quantization, activations, kv_cache_dtype)
    print(json.dumps(result) if as_json else format_table(result))
    return result


# ---------------------------------------------------------------- sampler micro-benchmark

_PENALTIES: dict[str, Any] = dict(repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.5, ban=True)
SAMPLER_CASES: dict[str, dict[str, Any]] = {
    "all methods (T=0.8 top_k=50 top_p=0.9 min_p=0.05 penalties bans logprobs=5)":
        dict(top_k=50, top_p=0.9, min_p=0.05, logprobs=5, **_PENALTIES),
    "all methods but top_k off (top_p=0.9 min_p=0.05 penalties logprobs=5)":
        dict(top_p=0.9, min_p=0.05, logprobs=5, **_PENALTIES),
    "top_p=0.95 only": dict(top_p=0.95),
    "temperature only (T=0.8)": dict(),
    "greedy only": dict(temperature=0.0),
    "greedy + penalties + logprobs=5": dict(temperature=0.0, logprobs=5, **_PENALTIES),
}


def _sampler_batch(n: int, vocab: int, rng: np.random.Generator, **kw: Any) -> SamplingBatch:
    def full(v: Any, dt: Any) -> np.ndarray:
        return np.full(n, v, dtype=dt)

    return SamplingBatch(
        temperature=full(kw.get("temperature", 0.8), np.float32),
        top_p=full(kw.get("top_p", 1.0), np.float32),
        top_k=full(kw.get("top_k", 0), np.int32),
        min_p=full(kw.get("min_p", 0.0), np.float32),
        presence_penalty=full(kw.get("presence_penalty", 0.0), np.float32),
        frequency_penalty=full(kw.get("frequency_penalty", 0.0), np.float32),
        repetition_penalty=full(kw.get("repetition_penalty", 1.0), np.float32),
        output_token_ids=[rng.integers(0, vocab, 128) for _ in range(n)],
        prompt_token_ids=[rng.integers(0, vocab, 512) for _ in range(n)],
        generators=[make_generator(i) for i in range(n)],
        banned_token_ids=[np.array([0, 2]) if kw.get("ban") else None for _ in range(n)],
        num_logprobs=full(kw.get("logprobs", -1), np.int32),
    )


def bench_sampler(rows: int = 32, vocab: int = 49152, repeats: int = 30) -> list[dict[str, Any]]:
    """sample() on [rows, vocab] random logits for each of SAMPLER_CASES: ms per call, median and min."""
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    results = []
    for name, kw in SAMPLER_CASES.items():
        batch = _sampler_batch(rows, vocab, rng, **kw)
        sample(logits, batch)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            sample(logits, batch)
            times.append(time.perf_counter() - t0)
        results.append({"case": name, "median_ms": float(np.median(times)) * 1e3, "min_ms": min(times) * 1e3})
    return results


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["sampler"]:
        print("usage: python -m nvllm.bench sampler  (the engine bench is `nvllm bench`)", file=sys.stderr)
        return 2
    rows, vocab, repeats = 32, 49152, 30
    print(f"sample(): N={rows} rows, V={vocab}, numpy {np.__version__}; ms per call, median (min) of {repeats}")
    for r in bench_sampler(rows, vocab, repeats):
        print(f"  {r['median_ms']:7.2f} ({r['min_ms']:6.2f})  {r['case']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
