"""Throughput and latency, each figure beside floors measured in the same run with the same BLAS
(bench/floors.py says what each floor is). Every figure is also given as a fraction of its floor (1.0 =
at the floor); bench/report.py lays the result out as a table.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from nvllm.bench.counts import resolved
from nvllm.bench.floors import (
    Floors,
    floor_pass,
    kernel_floors,
    machine_info,
    measure_bandwidth_gbs,
    measure_sgemm_gflops,
    weight_formats,
    weight_matmul_params,
)
from nvllm.bench.progress import Progress
from nvllm.bench.report import format_runs, pct
from nvllm.config import load_settings
from nvllm.engine.assembly.factory import build_engine, read_model_info
from nvllm.engine.assembly.memory import give_back_memory
from nvllm.engine.assembly.model_info import ModelInfo
from nvllm.engine.llm_engine import LLMEngine
from nvllm.model.decoder import Model
from nvllm.model.kernels import matmul, ops
from nvllm.model.kernels import threads as kernel_threads
from nvllm.sampling_params import SamplingParams


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
                     prefill_lens: list[int], progress: Progress, threads: int | Sequence[int] = 0,
                     quantization: str | None = None, activations: str | None = None,
                     kv_cache_dtype: str | None = None) -> list[dict[str, Any]]:
    """The whole measurement once per thread count (0: the default count), each beside floors measured at that
    count: one result each, in the order given. The model is loaded once; the kernels and BLAS are set to
    each count in turn (kernels/threads.py), which they read at every call."""
    counts = resolved([threads] if isinstance(threads, int) else threads)
    rss_peak = [psutil.Process().memory_info().rss]

    def sample_rss() -> None:
        rss_peak[0] = max(rss_peak[0], psutil.Process().memory_info().rss)

    max_c = max(concurrency)
    budget = max(512, max(prefill_lens))
    overrides: dict[str, Any] = {
        "model": {"path": str(model_dir), "threads": counts[0], "quantization": quantization,
                  "activations": activations},
        "cache": {"block_size": 16, "enable_prefix_caching": False, "dtype": kv_cache_dtype},
        "scheduler": {"max_num_seqs": max_c, "max_num_batched_tokens": budget,
                      "max_model_len": max(prompt_len + gen_len, max(prefill_lens)) + 1}}
    info = read_model_info(load_settings(overrides=overrides))   # pages per sequence follow the pool's groups
    overrides["cache"]["num_blocks"] = num_blocks = run_blocks(info, max_c, prompt_len + gen_len, max(prefill_lens),
                                                               budget)
    # The machine's floors first, at every count, on a buffer no bigger than what the run holds anyway (the
    # weights and the pool, 64 to 256 MiB): it is freed before the model loads, and so it does not become the
    # process's peak resident memory, which is what an outside measure (/usr/bin/time) reads.
    held_mib = (info.weight_bytes + num_blocks * 16 * info.bytes_per_token) >> 20
    buffer_mib = max(64, min(256, held_mib))
    machine: dict[int, tuple[float, float]] = {}
    for n in counts:
        progress(f"measuring the machine's floors on {n} thread{'s' * (n > 1)}")
        kernel_threads.configure(n)
        machine[n] = measure_bandwidth_gbs(buffer_mib), measure_sgemm_gflops()
    give_back_memory()   # what BLAS's threads freed, kept by glibc's arenas until trimmed: 10 MiB here
    progress("loading model")
    engine = build_engine(load_settings(overrides=overrides))
    sample_rss()
    results = []
    for n in counts:
        kernel_threads.configure(n)
        results.append(_bench_at(engine, model_dir, n, *machine[n], concurrency, prompt_len, gen_len, prefill_lens,
                                 progress, sample_rss))
        results[-1]["peak_rss_mib"] = round(rss_peak[0] / 2**20, 1)   # of the whole process, so far
        results[-1]["floors"]["bandwidth_buffer_mib"] = buffer_mib
        results[-1]["pool_blocks"] = num_blocks
        results[-1]["preemptions"] = engine.scheduler.num_preemptions   # 0: the pool held every run
    progress.done()
    return results


def run_blocks(info: ModelInfo, streams: int, tokens: int, prefill: int, budget: int) -> int:
    """The pages the run needs and no more (a bigger pool is resident memory the run never uses): `streams`
    sequences of `tokens` at once, or one prefill of `prefill` tokens, whichever is more. Every run, warm-ups
    included, finishes before the next starts, no prefix cache keeps a finished one's pages, and a sequence's
    last token is sampled, never computed; the result's "preemptions" would show a pool too small."""
    return max(streams * info.blocks_for(tokens, 16, budget), info.blocks_for(prefill + 1, 16, budget))


def decoder(engine: LLMEngine) -> Model:
    """The engine's model, which these benchmarks need to generate (`nvllm bench --embed` measures the others)."""
    if not isinstance(engine.model, Model):
        raise ValueError(f"{engine.model.config.architecture} does not generate text: measure it with --embed")
    return engine.model


def _bench_at(engine: LLMEngine, model_dir: Path, threads: int, bandwidth: float, sgemm: float,
              concurrency: list[int], prompt_len: int, gen_len: int, prefill_lens: list[int], progress: Progress,
              sample_rss: Callable[[], None]) -> dict[str, Any]:
    """One count's run: the kernels' floors at `threads` (set already), then prefill and decode beside them."""
    at = f" on {threads} thread{'s' * (threads > 1)}"
    mc = decoder(engine).config
    w = decoder(engine).weights
    body, head = weight_matmul_params(w)
    floors = Floors(bandwidth_gbs=bandwidth, sgemm_gflops=sgemm, weight_bytes=w.nbytes,
                    flops_per_token=2.0 * (body + head))
    head_flops = 2.0 * head
    rng = np.random.default_rng(0)
    result: dict[str, Any] = {
        "machine": {**machine_info(), "threads": threads, "kernels": ops.describe(),
                    "matmul_kernels": matmul.describe()},
        "model": {"path": str(model_dir), "architecture": mc.architecture, "parameters": mc.num_params,
                  "layers": mc.num_layers, "hidden": mc.hidden_size, "vocab": mc.vocab_size,
                  "weight_bytes": w.nbytes, "weight_formats": weight_formats(w)},
        "floors": {"memory_bandwidth_gbs": round(floors.bandwidth_gbs, 2),
                   "sgemm_gflops": round(floors.sgemm_gflops, 1),
                   "weight_read_ms": round(floors.weight_bytes / floors.bandwidth_gbs / 1e6, 2)},
        "prefill": [], "decode": [],
    }
    # measured with the engine's kernel variant in place (it sets it) and this count's threads, before any request
    progress("measuring the integer peak and the one-row kernels" + at)
    result["floors"].update(kernel_floors(w, threads, floors.bandwidth_gbs))
    for n in prefill_lens:
        progress(f"prefill {n} tokens" + at)
        prompt = random_prompt(rng, mc.vocab_size, n)
        run_requests(engine, [prompt], 1)  # warm-up
        times = []
        for _ in range(3):  # each run beside a fresh floor; best of each
            mm = floors.matmul(w, n, 1, decoder(engine).workspace.take(n))   # in the engine's own scratch
            times.append(run_requests(engine, [random_prompt(rng, mc.vocab_size, n)], 1)[0])
        t = min(times)
        sample_rss()
        roof = floors.roofline(n, 1, head_flops)
        result["prefill"].append({
            "prompt_tokens": n, "seconds": round(t, 6), "tokens_per_s": round(n / t, 1),
            "matmul_floor_s": round(mm, 6), "fraction_of_floor": round(mm / t, 3),
            "roofline_s": round(roof, 6), "fraction_of_roofline": round(roof / t, 3)})
        if "int_peak" in result["floors"]:   # the matmuls' multiply-adds at the dot instruction's peak
            peak_s = floors.int_peak_s(n, 1, head_flops, result["floors"]["int_peak"]["gops"])
            result["prefill"][-1].update({"int_peak_s": round(peak_s, 6), "fraction_of_int_peak": round(peak_s / t, 3)})
    for c in concurrency:
        progress(f"decode at concurrency {c}" + at)
        prompts = [random_prompt(rng, mc.vocab_size, prompt_len) for _ in range(c)]
        run_requests(engine, [p[:16] for p in prompts[:2]], 4)  # warm-up
        result["decode"].append(_decode_at(engine, floors, prompts, gen_len, head_flops, progress, sample_rss))
    return result


def _decode_at(engine: LLMEngine, floors: Floors, prompts: list[list[int]], gen_len: int, head_flops: float,
               progress: Progress, sample_rss: Callable[[], None]) -> dict[str, Any]:
    """Decode with len(prompts) requests in flight: tokens/s, TTFT and ITL beside the matmul floor."""
    c = len(prompts)
    w = decoder(engine).weights
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


def run(model_dir: Path | None, concurrency: list[int], prompt_len: int, gen_len: int,
        target: str | None, as_json: bool, prefill_lens: list[int] | None = None,
        threads: int | Sequence[int] = 0, quantization: str | None = None, activations: str | None = None,
        kv_cache_dtype: str | None = None) -> list[dict[str, Any]]:
    """Measures and prints: one result per thread count; as JSON, one object for one count (the shape scripts
    read), a list of them for several."""
    progress = Progress(enabled=True)
    if target:   # asyncio and gRPC only for a daemon's run: an in-process one does not hold them
        import asyncio

        from nvllm.bench.target import bench_target

        results = [asyncio.run(bench_target(target, concurrency, prompt_len, gen_len, progress))]
    else:
        assert model_dir is not None
        results = bench_in_process(model_dir, concurrency, prompt_len, gen_len, prefill_lens or [128, 512],
                                   progress, threads, quantization, activations, kv_cache_dtype)
    if as_json:
        print(json.dumps(results[0] if len(results) == 1 else results))
    else:
        print(format_runs(results))
    return results
