"""sample() alone on random logits, for a few parameter mixes (`python -m nvllm.bench sampler`)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from nvllm.model.sampling.batch import SamplingBatch
from nvllm.model.sampling.sampler import make_generator, sample

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


