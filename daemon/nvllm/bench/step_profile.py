"""Where a decode step's time goes (`nvllm bench --profile`): an engine's decode steps at a number of streams,
each part of LLMEngine.step timed by wrapping the functions the step calls, in microseconds per step, and the
rest of the step (its own Python: the loops over the batch, the counters) as "the step's own". The wrappers
are this bench's, put on for the measured steps and taken off after; they cost about a microsecond a call,
which the figures include.

The parts, in the order the step runs them: the speculator's proposals, the scheduler, packing the batch,
the model's forward pass (a decoder's as its layers, its logits and the rest of it), the sampler's rows,
sampling, appending each token and checking the stops, and the outputs handed back.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

import nvllm.engine.llm_engine as llm_engine
from nvllm.bench.floors import machine_info
from nvllm.config import load_settings
from nvllm.engine.assembly.factory import build_engine
from nvllm.engine.llm_engine import LLMEngine
from nvllm.model.kernels import matmul
from nvllm.sampling_params import SamplingParams

OWN = "the step's own"
COUNTED_STEPS = 32   # steps after the timed ones whose barriers the team counts


# A decoder's forward pass in two parts beside the rest of it: its layers (a decode step's are one C call) and
# the logits (the final norm and the vocabulary's matmul).
INSIDE_FORWARD = (("_layers", "forward: layers"), ("_logits", "forward: logits"))


def _parts(engine: LLMEngine) -> list[tuple[Any, str, str]]:
    """(owner, attribute, part): what the step calls, on the engine's objects or as llm_engine's names."""
    model = engine.model
    return [(engine.speculator, "propose", "speculation"), (engine.scheduler, "schedule", "schedule"),
            (llm_engine, "pack", "pack"), (model, "forward", "forward"),
            *((model, name, part) for name, part in INSIDE_FORWARD if hasattr(model, name)),
            (llm_engine, "sampling_batch", "sampling rows"), (llm_engine, "plain_greedy", "sampling rows"),
            (llm_engine, "sample", "sample"), (llm_engine, "greedy", "sample"),
            (engine, "_append", "append and stops"), (llm_engine, "request_output", "outputs")]


@contextmanager
def timed_parts(engine: LLMEngine) -> Iterator[dict[str, float]]:
    """Seconds spent in each part while inside; every wrapper is taken off on the way out."""
    totals: dict[str, float] = defaultdict(float)
    put: list[tuple[Any, str, Any, bool]] = []   # (owner, name, original, an instance's own attribute)

    def wrap(owner: Any, name: str, part: str) -> None:
        original: Callable[..., Any] = getattr(owner, name)
        own = not isinstance(owner, type(llm_engine)) and name not in vars(owner)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                totals[part] += time.perf_counter() - t0

        setattr(owner, name, timed)
        put.append((owner, name, original, own))

    try:
        for owner, name, part in _parts(engine):
            wrap(owner, name, part)
        yield totals
    finally:
        for owner, name, original, own in reversed(put):
            if own:
                delattr(owner, name)     # the bound method is the class's again
            else:
                setattr(owner, name, original)


def profile(engine: LLMEngine, streams: int, prompt_len: int, steps: int, seed: int = 0) -> dict[str, Any]:
    """`streams` random prompts of prompt_len tokens prefilled, then `steps` decode steps timed part by part:
    {"streams", "steps", "step_us", "parts_us": {part: microseconds per step}, "tokens_per_s"}."""
    rng = np.random.default_rng(seed)
    vocab = engine.model.config.vocab_size
    counted = min(steps, COUNTED_STEPS)
    params = SamplingParams(temperature=0, max_tokens=steps + counted + 2, ignore_eos=True)
    ids = [f"profile-{time.monotonic_ns()}-{i}" for i in range(streams)]
    for rid in ids:
        engine.add_request(rid, rng.integers(100, min(vocab, 30000), prompt_len).tolist(), params)
    started: set[str] = set()
    while len(started) < streams and engine.has_unfinished():   # prefill, and each stream's first token
        started.update(o.request_id for o in engine.step() if o.token_ids)
    with timed_parts(engine) as parts:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        wall = time.perf_counter() - t0
    # The team's barriers over a few more steps, counted apart so that their clock reads stay off the timed ones.
    matmul.team_stats(True)
    t1 = time.perf_counter()
    for _ in range(counted):
        engine.step()
    counted_wall = time.perf_counter() - t1
    barriers, waited_s, sleeps = matmul.team_stats(False)
    for rid in ids:
        engine.abort_request(rid)
    while engine.has_unfinished():
        engine.step()
    per = {part: 1e6 * s / steps for part, s in parts.items()}
    inside = [per[part] for _, part in INSIDE_FORWARD if part in per]
    if inside:   # the forward pass's own Python, less its parts timed inside it
        per["forward: the rest"] = max(0.0, per.pop("forward") - sum(inside))
    per[OWN] = max(0.0, 1e6 * wall / steps - sum(per.values()))
    layers = engine.model.config.num_layers
    return {"streams": streams, "steps": steps, "step_us": 1e6 * wall / steps, "parts_us": per,
            "tokens_per_s": streams * steps / wall,
            "team": {"threads": engine.threads, "barriers_per_step": barriers / counted,
                     "barriers_per_layer": barriers / counted / layers, "wait_us_per_step": 1e6 * waited_s / counted,
                     "counted_step_us": 1e6 * counted_wall / counted,
                     "sleeps_per_step": sleeps / counted}}


def bench_profile(model: str, concurrency: list[int], prompt_len: int, steps: int, threads: int = 0,
                  quantization: str = "", activations: str = "") -> dict[str, Any]:
    """The model's engine as the daemon builds it (no prefix cache: every prompt is computed), one profile per
    number of streams."""
    model_settings: dict[str, Any] = {"path": model, "threads": threads, "quantization": quantization}
    if activations:
        model_settings["activations"] = activations
    engine = build_engine(load_settings(overrides={
        "model": model_settings, "cache": {"enable_prefix_caching": False},
        "scheduler": {"max_num_seqs": max(concurrency), "max_model_len": prompt_len + steps + COUNTED_STEPS + 8}}))
    profile(engine, 1, prompt_len, 4)   # warm-up: the first steps pay for what is made once
    return {"machine": {**machine_info(), "threads": engine.threads}, "model": model,
            "runs": [profile(engine, n, prompt_len, steps) for n in concurrency]}


def format_profile(result: dict[str, Any]) -> str:
    step = result["step_us"]
    lines = [f"{result['streams']} stream{'s' if result['streams'] != 1 else ''}: {step:,.0f} us a decode step "
             f"(mean of {result['steps']}), {result['tokens_per_s']:,.1f} tokens/s",
             f"  {'part':<18}{'us/step':>10}{'share':>8}"]
    for part, us in sorted(result["parts_us"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {part:<18}{us:>10,.1f}{us / step:>8.1%}")
    t = result["team"]
    if t["threads"] > 1:
        lines.append(f"  the team of {t['threads']} threads: {t['barriers_per_step']:,.0f} barriers a step "
                     f"({t['barriers_per_layer']:.1f} a layer); the threads waited at them "
                     f"{t['wait_us_per_step']:,.0f} us a step in all, of {t['threads']} x "
                     f"{t['counted_step_us']:,.0f} us (those steps' own time), and fell asleep "
                     f"{t['sleeps_per_step']:.2f} times a step")
    return "\n".join(lines)
