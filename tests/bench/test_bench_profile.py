"""nvllm bench --profile (bench/step_profile.py): each part of a decode step timed, the parts within the step,
the wrappers taken off after, the step's answers unchanged by them, and bad flags refused naming them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nvllm.engine.llm_engine as llm_engine
from helpers.engines import backed_engine
from nvllm.bench.step_profile import OWN, format_profile, profile, timed_parts
from nvllm.config import Settings
from nvllm.engine.llm_engine import LLMEngine
from nvllm.model.kernels import matmul
from nvllm.sampling_params import SamplingParams


def engine(path: Path) -> LLMEngine:
    s = Settings()
    s.model.path = str(path)
    s.model.threads = 1
    s.cache.enable_prefix_caching = False
    return backed_engine(s)


def test_every_part_is_timed_within_the_step(tiny_models: dict[str, Path]) -> None:
    r = profile(engine(tiny_models["tiny-llama"]), 3, prompt_len=12, steps=10)
    parts = r["parts_us"]
    assert {"schedule", "pack", "forward: layers", "forward: logits", "forward: the rest", "sampling rows", "sample",
            "append and stops", "outputs", OWN} <= set(parts)
    assert all(us > 0 for part, us in parts.items() if part not in ("speculation", OWN, "forward: the rest"))
    assert sum(parts.values()) <= r["step_us"] * 1.001 + 1
    assert r["tokens_per_s"] > 0 and r["streams"] == 3 and r["steps"] == 10


def test_the_wrappers_come_off_and_change_no_answer(tiny_models: dict[str, Path]) -> None:
    e = engine(tiny_models["tiny-llama"])
    originals = (llm_engine.pack, llm_engine.sample, llm_engine.request_output, llm_engine.sampling_batch)

    def greedy(rid: str) -> list[int]:
        e.add_request(rid, [5, 6, 7, 8, 9], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        out: list[int] = []
        while e.has_unfinished():
            out += [t for o in e.step() for t in o.token_ids]
        return out

    plain = greedy("plain")
    with timed_parts(e) as parts:
        timed = greedy("timed")
        assert parts["forward"] >= parts["forward: layers"] > 0
    assert timed == plain
    assert (llm_engine.pack, llm_engine.sample, llm_engine.request_output, llm_engine.sampling_batch) == originals
    for owner, name in ((e, "_append"), (e.model, "forward"), (e.model, "_layers"), (e.scheduler, "schedule"),
                        (e.speculator, "propose")):
        assert name not in vars(owner), name     # the class's method again


def test_the_cli_prints_a_table_or_json_and_refuses_bad_lengths(tiny_models: dict[str, Path]) -> None:
    base = [sys.executable, "-m", "nvllm.cli", "bench", "--profile", "--model", str(tiny_models["tiny-llama"]),
            "--concurrency", "1,2", "--prompt-len", "8", "--gen-len", "12", "--threads", "1"]
    res = subprocess.run([*base, "--json"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert [r["streams"] for r in result["runs"]] == [1, 2]
    table = subprocess.run(base, capture_output=True, text=True, timeout=300)
    assert table.returncode == 0 and "us a decode step" in table.stdout and "forward: layers" in table.stdout
    bad = subprocess.run([*base[:-6], "--gen-len", "0"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--gen-len" in bad.stderr
    two = subprocess.run([*base[:-2], "--threads", "1,2"], capture_output=True, text=True, timeout=300)
    assert two.returncode == 2 and "--profile" in two.stderr


def test_the_teams_barriers_are_counted_apart_from_the_timed_steps(tiny_models: dict[str, Path],
                                                                   smollm2_gguf: Path) -> None:
    s = Settings()
    s.model.path = str(smollm2_gguf)   # big enough that a decode step's ops are shared over two threads
    s.model.threads = 2
    s.cache.enable_prefix_caching = False
    e = backed_engine(s)
    r = profile(e, 1, prompt_len=12, steps=6)
    t = r["team"]
    layers = e.model.config.num_layers
    assert t["threads"] == 2 and t["barriers_per_step"] >= layers   # a decode step's layers: one C call
    assert t["barriers_per_layer"] == t["barriers_per_step"] / layers
    assert 0 < t["wait_us_per_step"] < 2 * t["counted_step_us"]
    e.add_request("after", [5, 6, 7], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    while e.has_unfinished():
        e.step()
    barriers, _, sleeps = matmul.team_stats(False)
    assert barriers == sleeps == 0   # counting was turned off: nothing since (a last wait may trail in)
    assert "barriers a step" in format_profile(r)
    one = profile(engine(tiny_models["tiny-llama"]), 1, prompt_len=12, steps=4)["team"]
    assert one["threads"] == 1 and one["barriers_per_step"] == 0 and "barriers" not in format_profile(
        {**r, "team": one})
