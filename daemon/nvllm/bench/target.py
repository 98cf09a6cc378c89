"""A running daemon measured over gRPC (`nvllm bench --target ADDR`): requests in flight at each concurrency,
tokens per second, time to first token and between tokens as a client sees them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from nvllm.bench.floors import machine_info
from nvllm.bench.progress import Progress
from nvllm.bench.report import pct


async def bench_target(target: str, concurrency: list[int], prompt_len: int, gen_len: int,
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


