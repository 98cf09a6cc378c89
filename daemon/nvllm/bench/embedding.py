"""`nvllm bench --embed`: an embedding model's (or a reranker's) throughput, in process: `inputs` inputs of
`tokens` tokens each (random ids between the tokenizer's own special tokens, as a text of that length would
come), all added at once and scheduled as the daemon schedules them (the token budget decides how many share a
forward pass; llama.cpp's llama-embedding batches 2,048 tokens by default, and so does this bench unless told
otherwise). Sequences/s and tokens/s are the best of `repeats` runs, after one run that warms the caches."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from nvllm.bench.floors import machine_info
from nvllm.config import load_settings
from nvllm.engine.assembly.factory import build_engine
from nvllm.engine.llm_engine import LLMEngine
from nvllm.pooling_params import PoolingParams

BUDGET = 2048   # tokens a step computes: llama-embedding's default batch


def random_inputs(engine: LLMEngine, inputs: int, tokens: int, seed: int = 0) -> list[list[int]]:
    """Inputs of exactly `tokens` ids: the tokenizer's own ends ([CLS] ... [SEP]) around random ordinary ids."""
    ends, _ = engine.tokenizer.encode_within("", tokens)
    head, tail = (ends[:1], ends[1:]) if ends else ([], [])
    vocab = engine.model.config.vocab_size
    rng = np.random.default_rng(seed)
    low = min(1000, vocab // 2)   # past the special and unused ids a vocabulary starts with
    n = tokens - len(head) - len(tail)
    return [head + rng.integers(low, vocab, n).tolist() + tail for _ in range(inputs)]


def _run_once(engine: LLMEngine, batch: list[list[int]], round_: int) -> tuple[float, int]:
    """(seconds, steps) to embed every input of the batch."""
    t0 = time.perf_counter()
    for i, ids in enumerate(batch):
        engine.add_request(f"e{round_}-{i}", {"prompt_token_ids": ids}, PoolingParams())
    steps = 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.error is not None:
                raise RuntimeError(f"the engine failed an input: {out.error}")
        steps += 1
    return time.perf_counter() - t0, steps


def bench_embed(model: Path, inputs: int = 64, tokens: int = 128, threads: int = 0, repeats: int = 3,
                budget: int = BUDGET, quantization: str = "") -> dict[str, Any]:
    engine = build_engine(load_settings(overrides={
        "model": {"path": str(model), "threads": threads, "quantization": quantization},
        "scheduler": {"max_num_batched_tokens": max(budget, tokens), "max_num_seqs": inputs,
                      "max_model_len": tokens}}))
    if engine.task == "generate":
        raise ValueError(f"{model} generates text: --embed measures embedding models and rerankers")
    if engine.task == "rerank":
        raise ValueError(f"{model} is a reranker: --embed measures embedding models (a reranker's pairs are "
                         f"inputs of the same cost; serve it and time /v1/rerank)")
    batch = random_inputs(engine, inputs, tokens)
    _run_once(engine, batch[: max(1, inputs // 8)], -1)    # warm-up: caches, BLAS's threads, the allocator
    runs = [_run_once(engine, batch, r) for r in range(repeats)]
    best, steps = min(runs)
    return {"machine": {**machine_info(), "threads": engine.threads},
            "model": {"path": str(model), "architecture": engine.model.config.architecture, "task": engine.task,
                      "weight_bytes": int(engine.model.weights.nbytes)},
            "inputs": inputs, "tokens_per_input": tokens, "budget": max(budget, tokens), "steps": steps,
            "seconds": [round(s, 4) for s, _ in runs],
            "sequences_per_s": round(inputs / best, 1), "tokens_per_s": round(inputs * tokens / best, 1)}


def format_embed(r: dict[str, Any]) -> str:
    m, mod = r["machine"], r["model"]
    return "\n".join([
        f"machine: {m['cpu']} ({m['arch']}, {m['cores']} cores), {m['threads']} threads",
        f"model: {mod['path']} ({mod['architecture']}, {mod['weight_bytes'] / 2**20:.1f} MiB of weights)",
        f"{r['inputs']} inputs of {r['tokens_per_input']} tokens, {r['budget']} tokens a step ({r['steps']} steps): "
        f"{r['sequences_per_s']} sequences/s, {r['tokens_per_s']} tokens/s (best of {len(r['seconds'])}: "
        f"{', '.join(f'{s:.3f}' for s in r['seconds'])} s)"])
