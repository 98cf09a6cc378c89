"""nvllm against transformers' own logits and greedy continuations (tests/golden/, made by make_golden.py).

Logits must agree within 1e-3 at every position however the tokens reach the model: the whole prompt
at once, chunks of 7, one token at a time through the cache, several sequences packed in one batch,
and steps that mix prefill chunks with decode tokens (on the exact float path); the greedy continuations
run with model.activations "exact" (x in 16 bits), whatever the default.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from helpers.paths import GOLDEN
from helpers.schedule import run_schedule
from nvllm import LLM, SamplingParams
from nvllm.model.decoder import Model
from nvllm.model.weights.gguf_file import read_gguf
from nvllm.model.weights.gguf_weights import load_gguf_weights

TOL = 1e-3
MODELS = ("tiny-llama", "tiny-qwen2", "tiny-llama-f16", "tiny-qwen3", "smollm2-135m-instruct", "tiny-phi3",
          "tiny-smollm3", "tiny-gemma3")
# The tiny models' cases also run on emulated aarch64 (deploy/aarch64-check.sh, pytest -m aarch64).
# Each model in both forms: its Hugging Face folder, and its GGUF file (the shipped Q4_1 file for SmolLM2,
# whose folder holds the same weights dequantized; the tiny ones written from their folders).
FORMS = ("folder", "gguf")
MODEL_PARAMS = [pytest.param((n, f), marks=[] if n == "smollm2-135m-instruct" else [pytest.mark.aarch64],
                             id=f"{n}-{f}") for n in MODELS for f in FORMS]


def model_path(name: str, form: str, request) -> Path:
    if name == "smollm2-135m-instruct":
        return request.getfixturevalue("smollm2" if form == "folder" else "smollm2_gguf")
    return request.getfixturevalue("tiny_models" if form == "folder" else "tiny_ggufs")[name]


class Golden:
    def __init__(self, name: str) -> None:
        path = GOLDEN / f"{name}.safetensors"
        if not path.exists():
            pytest.fail(f"{path} is missing: run tests/golden/make_golden.py")
        self.t = load_file(path)
        self.subset = self.t.get("vocab_subset")

    def logits(self, key: str) -> np.ndarray:
        return self.t[key] if self.subset is None else self.t[key + "_subset"]

    def pick(self, ours: np.ndarray) -> np.ndarray:
        return ours if self.subset is None else ours[:, self.subset]

    def cases(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(prompt ids, reference logits) for the 64-token prompt and each batch prompt."""
        out = [(self.t["prompt_ids"], self.logits("logits"))]
        i = 0
        while f"batch_{i}_ids" in self.t:
            out.append((self.t[f"batch_{i}_ids"], self.logits(f"batch_{i}_logits")))
            i += 1
        return out


@pytest.fixture(scope="module", params=MODEL_PARAMS)
def loaded(request):
    name, form = request.param
    path = model_path(name, form, request)
    if form == "gguf":
        g = read_gguf(path)
        return f"{name} ({form})", Model(g.config, load_gguf_weights(g)), Golden(name)
    return f"{name} ({form})", Model.from_dir(path), Golden(name)


def rope_groups(model: Model, cases: list[tuple[np.ndarray, np.ndarray]]):
    """The cases in groups, the model set for each: a longrope model (tiny-phi3) takes its short or long
    factors by max_model_len (Model.set_context), transformers by a whole prompt's length, so a prompt runs
    with max_model_len its own length, and those that then agree run together."""
    groups: dict[bool, list[tuple[np.ndarray, np.ndarray]]] = {}
    for c in cases:
        model.set_context(len(c[0]))
        groups.setdefault(model.long_rope, []).append(c)
    for group in groups.values():
        model.set_context(len(group[0][0]))
        yield group


def check(golden: Golden, ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    diff = np.abs(golden.pick(ours) - ref).max()
    assert diff < TOL, f"{what}: max |logit diff| {diff:.2e} >= {TOL}"


def numpy_at_scale(name: str, kernel_path: str) -> None:
    """The shipped SmolLM2 GGUF on the NumPy path runs its whole prompt and packed batches here; its schedules
    step by step (30 layers of Q4_1 dequantized in NumPy at each of 64 steps: over a minute of the suite) are
    the tiny models' cases, which hold the same code on every architecture and format."""
    if kernel_path == "numpy" and name.startswith("smollm2-135m-instruct (gguf)"):
        pytest.skip("step-by-step schedules of the shipped SmolLM2 GGUF on the NumPy path: the tiny models' cases")


def chunks(n: int, size: int) -> list[int]:
    return [size] * (n // size) + ([n % size] if n % size else [])


@pytest.mark.usefixtures("exact_float_matmuls")
def test_whole_prompt(loaded, kernel_path):
    name, model, g = loaded
    ids, ref = g.cases()[0]
    model.set_context(len(ids))
    check(g, run_schedule(model, [ids], [[len(ids)]])[0], ref, f"{name} whole")


@pytest.mark.usefixtures("exact_float_matmuls")
def test_chunks_of_seven(loaded, kernel_path):
    name, model, g = loaded
    numpy_at_scale(name, kernel_path)
    ids, ref = g.cases()[0]
    model.set_context(len(ids))
    check(g, run_schedule(model, [ids], [[c] for c in chunks(len(ids), 7)])[0], ref, f"{name} chunks of 7")


@pytest.mark.usefixtures("exact_float_matmuls")
def test_token_by_token(loaded, kernel_path):
    name, model, g = loaded
    numpy_at_scale(name, kernel_path)
    ids, ref = g.cases()[0]
    model.set_context(len(ids))
    check(g, run_schedule(model, [ids], [[1]] * len(ids))[0], ref, f"{name} token by token")


@pytest.mark.usefixtures("exact_float_matmuls")
def test_packed_batch(loaded, kernel_path):
    name, model, g = loaded
    assert len(g.cases()[1:]) >= 3
    for cases in rope_groups(model, g.cases()[1:]):
        prompts = [c[0] for c in cases]
        outs = run_schedule(model, prompts, [[len(p) for p in prompts]])
        for k, ((_, ref), ours) in enumerate(zip(cases, outs)):
            check(g, ours, ref, f"{name} packed batch, prompt {k}")


@pytest.mark.usefixtures("exact_float_matmuls")
def test_mixed_prefill_and_decode_steps(loaded, kernel_path):
    """Each step mixes sequences at different stages: some prefilling a chunk, some one token at a time."""
    name, model, g = loaded
    numpy_at_scale(name, kernel_path)
    for cases in rope_groups(model, g.cases()[1:]):
        prompts = [c[0] for c in cases]
        rng = np.random.default_rng(3)
        left = [len(p) for p in prompts]
        steps = []
        while any(left):
            step = []
            for i, n in enumerate(left):
                take = 0 if n == 0 else min(n, int(rng.choice([0, 1, 1, 5, 16])))
                step.append(take)
                left[i] -= take
            if any(step):
                steps.append(step)
        outs = run_schedule(model, prompts, steps)
        for k, ((_, ref), ours) in enumerate(zip(cases, outs)):
            check(g, ours, ref, f"{name} mixed steps, prompt {k}")


@pytest.mark.usefixtures("keep_int_variant")
@pytest.mark.parametrize("which", MODEL_PARAMS)
def test_greedy_continuations_match_transformers(which, request):
    name, form = which
    path = GOLDEN / f"{name}_greedy.json"
    if not path.exists():
        pytest.fail(f"{path} is missing: run tests/golden/make_golden.py")
    cases = json.loads(path.read_text())
    if name == "smollm2-135m-instruct":
        assert len(cases) >= 8
    llm = LLM(model_path(name, form, request), num_blocks=256, max_model_len=2048, activations="exact")
    outs = llm.generate([{"prompt_token_ids": c["prompt_ids"]} for c in cases],
                        SamplingParams(temperature=0, max_tokens=max(len(c["output_ids"]) for c in cases)))
    for c, o in zip(cases, outs):
        n = len(c["output_ids"])
        assert o.token_ids[:n] == c["output_ids"], f"{name} / {c['name']}: {o.text!r} != {c['output_text']!r}"
        if c.get("stopped_at_eos"):
            assert o.finish_reason == "stop" and len(o.token_ids) == n
    # Our tokenizer and chat template give transformers' prompt ids.
    for c in cases:
        ids = (llm.tokenizer.encode_chat(c["messages"]) if c["kind"] == "chat"
               else llm.tokenizer.encode(c["prompt"]))
        assert ids == c["prompt_ids"], f"{name} / {c['name']}: prompt tokenized differently"


@pytest.mark.usefixtures("keep_int_variant")
def test_smollm2_knows_the_capital_of_france(smollm2):
    llm = LLM(smollm2, num_blocks=64, max_model_len=1024, activations="exact")
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0, max_tokens=32))[0]
    assert out.text == "The capital of France is Paris."
    assert out.finish_reason == "stop"
