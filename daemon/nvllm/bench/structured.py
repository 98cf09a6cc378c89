"""What structured output costs per engine step, and what compiling a schema costs
(tools/bench_structured.py prints it).

For each batch size, the same decode steps run three ways in one engine, interleaved over `rounds`:
free text, constrained with the mask filled while the model runs (the default), and constrained with
it filled after. Every row decodes `steps` tokens of a JSON Schema answer long enough never to end
first (a string of at least 1000 characters), so each step has the same rows. Reported: the median step
time of each (wall and CPU milliseconds of all threads), the mask fill on its own, and sample() without
and with every row masked (the copy of the logits and the mask step); then the schema compile times
(llguidance's tokenizer, a cold compile, a cached one).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from nvllm.engine.llm_engine import LLMEngine
from nvllm.engine.structured.compiler import StructuredCompiler
from nvllm.model.sampling.batch import SamplingBatch
from nvllm.model.sampling.sampler import make_generator, sample
from nvllm.sampling_params import SamplingParams, StructuredSpec

MODES = ("free", "overlap", "after")

LONG = {"type": "object", "properties": {"story": {"type": "string", "minLength": 1000}},
        "required": ["story"], "additionalProperties": False}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "color": {"enum": ["red", "green", "blue"]},
        "score": {"type": "number", "minimum": -1, "maximum": 1, "multipleOf": 0.01},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "home": {"type": "object", "properties": {"city": {"type": "string"}, "floor": {"type": "integer"}},
                 "required": ["city", "floor"], "additionalProperties": False},
    },
    "required": ["name", "age", "color", "score", "tags", "home"],
    "additionalProperties": False,
}


def decode_steps(engine: LLMEngine, rows: int, steps: int, structured: bool,
                 tag: str) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds (this process, all its threads) of each step once all `rows` sequences decode
    (the prompt steps left out). CPU time is what a busy machine changes least."""
    spec = StructuredSpec("json_schema", json.dumps(LONG)) if structured else None
    for i in range(rows):
        params = SamplingParams(temperature=1.0, seed=i, max_tokens=steps + 1, ignore_eos=True, structured=spec)
        engine.add_request(f"{tag}-{i}", {"messages": [{"role": "user", "content": f"Tell story {i}."}]}, params)
    wall: list[float] = []
    cpu: list[float] = []
    while engine.has_unfinished():
        decoding = all(s.num_computed_tokens >= s.num_prompt_tokens for s in engine.seqs.values())
        full = len(engine.seqs) == rows
        t0, c0 = time.perf_counter(), time.process_time()
        engine.step()
        if decoding and full:
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return wall, cpu


def sampler_ms(engine: LLMEngine, rows: int, repeats: int = 30) -> tuple[float, float]:
    """Median sample() time for `rows` rows at temperature 1, without and with every row constrained."""
    vocab = engine.model.config.vocab_size
    matchers = [engine.structured.matcher(StructuredSpec("json_schema", json.dumps(PERSON))) for _ in range(rows)]
    bits = engine.structured.fill(matchers)
    logits = np.random.default_rng(0).standard_normal((rows, vocab)).astype(np.float32)
    out = []
    for constrained in (False, True):
        t = []
        for _ in range(repeats):
            batch = SamplingBatch(
                temperature=np.array([1.0] * rows), top_p=np.array([1.0] * rows), top_k=np.array([0] * rows),
                min_p=np.array([0.0] * rows), presence_penalty=np.array([0.0] * rows),
                frequency_penalty=np.array([0.0] * rows), repetition_penalty=np.array([1.0] * rows),
                output_token_ids=[np.zeros(0, np.int64)] * rows, prompt_token_ids=[np.zeros(0, np.int64)] * rows,
                generators=[make_generator(i) for i in range(rows)],
                allowed_tokens=bits if constrained else None, allowed_rows=np.arange(rows) if constrained else None)
            t0 = time.perf_counter()
            sample(logits, batch)
            t.append(time.perf_counter() - t0)
        out.append(statistics.median(t) * 1e3)
    return out[0], out[1]



def bench_structured(engine: LLMEngine, rows: list[int], steps: int = 16, rounds: int = 2) -> dict[str, Any]:
    """The step times of each mode at each batch size, the fill and sample() alone, the compile times."""
    compiler = engine.structured
    fills: list[float] = []
    fill = compiler.fill_ahead    # what the step calls

    def timed_fill(items: Any) -> np.ndarray:
        t0 = time.perf_counter()
        out = fill(items)
        fills.append(time.perf_counter() - t0)
        return out

    compiler.fill_ahead = timed_fill  # type: ignore[method-assign]  # this benchmark's own instrument
    try:
        decode_steps(engine, 1, 4, True, "warm")   # builds llguidance's tokenizer, compiles LONG
        result: dict[str, Any] = {"vocab": engine.model.config.vocab_size, "threads": engine.threads, "rows": []}
        for n in rows:
            wall: dict[str, list[float]] = {m: [] for m in MODES}
            cpu: dict[str, list[float]] = {m: [] for m in MODES}
            fill_s: list[float] = []
            for r in range(rounds):   # interleaved, so that a busy machine slows all three alike
                for mode in MODES:
                    engine.structured_overlap = mode != "after"
                    fills.clear()
                    w, c = decode_steps(engine, n, steps, mode != "free", f"{mode}-{n}-{r}")
                    wall[mode] += w
                    cpu[mode] += c
                    if mode == "after":
                        fill_s += fills
            plain, masked = sampler_ms(engine, n)
            result["rows"].append({
                "rows": n, **{f"{m}_ms": round(statistics.median(wall[m]) * 1e3, 2) for m in MODES},
                **{f"{m}_cpu_ms": round(statistics.median(cpu[m]) * 1e3, 2) for m in MODES},
                "fill_ms": round(statistics.median(fill_s) * 1e3, 3), "sample_ms": round(plain, 3),
                "mask_ms": round(masked - plain, 3)})
    finally:
        compiler.fill_ahead = fill  # type: ignore[method-assign]
        engine.structured_overlap = True
    result["compile"] = compile_times(engine)
    return result


def _timed(f: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def compile_times(engine: LLMEngine) -> dict[str, float]:
    """A fresh compiler over the engine's tokenizer: llguidance's tokenizer, a cold compile, a cached one (ms)."""
    cold = StructuredCompiler(engine.tokenizer, engine.model.config.vocab_size, engine.eos_token_ids)
    spec = StructuredSpec("json_schema", json.dumps(PERSON))
    try:
        return {"tokenizer_ms": round(_timed(cold.lltokenizer) * 1e3, 1),
                "cold_ms": round(_timed(lambda: cold.matcher(spec)) * 1e3, 3),
                "cached_ms": round(_timed(lambda: cold.matcher(spec)) * 1e3, 4)}
    finally:
        cold.close()


def format_structured(r: dict[str, Any]) -> str:
    lines = [f"vocab {r['vocab']}, {r['threads']} threads",
             "median per decode step, wall ms (CPU ms of all threads): free, constrained with the fill overlapping",
             "the forward pass, constrained with it after; the fill alone; sample() alone and what the mask adds",
             f"{'rows':>4} {'free':>14} {'overlap':>14} {'after':>14} {'fill ms':>8} {'sample ms':>9} {'+mask ms':>8}"]
    for row in r["rows"]:
        cells = [f"{row[f'{m}_ms']:.1f} ({row[f'{m}_cpu_ms']:.1f})" for m in MODES]
        lines.append(f"{row['rows']:>4} {cells[0]:>14} {cells[1]:>14} {cells[2]:>14} {row['fill_ms']:>8.2f} "
                     f"{row['sample_ms']:>9.2f} {row['mask_ms']:>8.2f}")
    c = r["compile"]
    lines.append(f"llguidance tokenizer {c['tokenizer_ms']:.0f} ms (once per engine); PERSON schema compile "
                 f"{c['cold_ms']:.2f} ms cold, {c['cached_ms']:.3f} ms cached")
    return "\n".join(lines)
