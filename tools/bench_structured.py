"""What structured output costs per engine step, and what compiling a schema costs.

    .venv/bin/python tools/bench_structured.py [--model models/smollm2-135m-instruct] [--rows 1 16 32]

For each batch size, the same decode steps run three ways in one engine, interleaved over `--rounds`:
free text, constrained with the mask filled while the model runs (the default), and constrained with
it filled after. Every row decodes `--steps` tokens of a JSON Schema answer long enough never to end
first (a string of at least 1000 characters), so each step has the same rows. Reports the median step
time of each, the mask fill on its own, and sample() without and with every row masked (the copy of
the logits and the mask step); then the schema compile times (llguidance's tokenizer, a cold
compile, a cached one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from nvllm.config import load_settings
from nvllm.engine.factory import build_engine
from nvllm.engine.structured import StructuredCompiler
from nvllm.model.sampling.batch import SamplingBatch
from nvllm.model.sampling.sampler import make_generator, sample
from nvllm.sampling_params import SamplingParams, StructuredSpec

ROOT = Path(__file__).resolve().parent.parent
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


def decode_steps(engine, rows: int, steps: int, structured: bool, tag: str) -> tuple[list[float], list[float]]:
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


def sampler_ms(engine, rows: int, repeats: int = 30) -> tuple[float, float]:
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "smollm2-135m-instruct"))
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 32])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    settings = load_settings(overrides={"model": {"path": args.model},
                                        "scheduler": {"max_num_seqs": max(args.rows)}})
    engine = build_engine(settings)
    compiler = engine.structured
    fills: list[float] = []
    fill = compiler.fill

    def timed_fill(matchers):
        t0 = time.perf_counter()
        out = fill(matchers)
        fills.append(time.perf_counter() - t0)
        return out

    compiler.fill = timed_fill  # type: ignore[method-assign]  # this tool's own instrument, on its own engine
    decode_steps(engine, 1, 4, True, "warm")   # builds llguidance's tokenizer, compiles LONG
    print(f"model {args.model}, vocab {engine.model.config.vocab_size}, {engine.threads} threads")
    print("median per decode step, wall ms (CPU ms of all threads): free, constrained with the fill overlapping the")
    print("forward pass, constrained with it after; the fill alone; sample() alone and what the mask adds to it")
    print(f"{'rows':>4} {'free':>14} {'overlap':>14} {'after':>14} {'fill ms':>8} {'sample ms':>9} {'+mask ms':>8}")
    for rows in args.rows:
        steps: dict[str, list[float]] = {"free": [], "overlap": [], "after": []}
        cpus: dict[str, list[float]] = {"free": [], "overlap": [], "after": []}
        fill_ms: list[float] = []
        for r in range(args.rounds):   # interleaved, so that a busy machine slows all three alike
            for mode in steps:
                engine.structured_overlap = mode != "after"
                fills.clear()
                wall, cpu = decode_steps(engine, rows, args.steps, mode != "free", f"{mode}-{rows}-{r}")
                steps[mode] += wall
                cpus[mode] += cpu
                if mode == "after":
                    fill_ms += fills
        med = {k: f"{statistics.median(v) * 1e3:.1f} ({statistics.median(cpus[k]) * 1e3:.1f})"
               for k, v in steps.items()}
        plain, masked = sampler_ms(engine, rows)
        print(f"{rows:>4} {med['free']:>14} {med['overlap']:>14} {med['after']:>14} "
              f"{statistics.median(fill_ms) * 1e3:>8.2f} {plain:>9.2f} {masked - plain:>8.2f}")
    engine.structured_overlap = True

    # Compile times, on a fresh compiler over the same tokenizer.
    t0 = time.perf_counter()
    cold = StructuredCompiler(engine.tokenizer, engine.model.config.vocab_size, engine.eos_token_ids)
    cold.lltokenizer()
    t_tok = time.perf_counter() - t0
    spec = StructuredSpec("json_schema", json.dumps(PERSON))
    t0 = time.perf_counter()
    cold.matcher(spec)
    t_cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    cold.matcher(spec)
    t_warm = time.perf_counter() - t0
    print(f"llguidance tokenizer {t_tok * 1e3:.0f} ms (once per engine); PERSON schema compile "
          f"{t_cold * 1e3:.2f} ms cold, {t_warm * 1e3:.3f} ms cached")
    cold.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
