"""A step with prefill chunks in one C call (kernels/step.py with prefill attention's tasks, csrc/step.c)
against its twin, decoder.py's loop over the layers: the same bits at every position for one sequence's
chunk of 2 .. 512 tokens, several sequences' chunks together, chunks after cached pages, chunks beside
decode rows, in every KV format, on one thread and more; Qwen2's biases, Qwen3's head norms, Phi-4-mini's
partial rotary, SmolLM3's NoPE layers and Gemma 3's sliding windows and norms. A chunk of more than
DECODE_ROWS rows goes through x a tile of rows at a time (a last tile of one row included)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers.schedule import run_schedule
from nvllm.model.decoder import Model
from nvllm.model.kernels import matmul, ops, step, threads
from nvllm.model.quant.kv_format import FORMATS_BY_NAME

pytestmark = [pytest.mark.aarch64,
              pytest.mark.skipif(matmul.lib is None or ops.lib is None, reason="the C kernels are not built")]

# steps[k][i]: prompt i's new tokens in step k. Chunks of one sequence (a 129-row step: two tiles of 64 and
# one row), chunks of three together after cached pages, a chunk beside decode rows, then decode alone.
SCHEDULES = {
    "one-sequence": [[2], [129], [65]],
    "many-after-cached": [[40, 17, 0], [70, 3, 90], [1, 1, 33], [1, 1, 1]],
    "mixed": [[5, 80], [1, 1], [1, 100], [1, 1]],
}


def prompts(steps: list[list[int]], vocab: int) -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    return [rng.integers(0, vocab, sum(s[i] for s in steps)) for i in range(len(steps[0]))]


def both_ways(model: Model, steps: list[list[int]], monkeypatch: pytest.MonkeyPatch, n_threads: int,
              kv: str = "f32") -> tuple[list, list, list[int]]:
    """Logits of the schedule with the layers in C and in the loop, and the rows of each step run in C."""
    calls: list[int] = []
    real = step.StepLayers.__call__

    def counted(self, *args, **kwargs):
        calls.append(args[0].shape[0])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(step.StepLayers, "__call__", counted)
    monkeypatch.setattr(threads, "count", n_threads)
    ids = prompts(steps, model.config.vocab_size)
    model.layers_in_c = True
    in_c = run_schedule(model, ids, steps, fmt=FORMATS_BY_NAME[kv])
    model.layers_in_c = False
    loop = run_schedule(model, ids, steps, fmt=FORMATS_BY_NAME[kv])
    return in_c, loop, calls


def assert_same_bits(in_c: list, loop: list) -> None:
    for i, (a, b) in enumerate(zip(in_c, loop)):
        assert a.shape == b.shape
        bad = np.flatnonzero(~(a == b).all(axis=1))
        assert not bad.size, f"prompt {i}: positions {bad.tolist()} differ, by up to {np.abs(a - b).max():.3g}"


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-phi3", "tiny-smollm3",
                                  "tiny-gemma3"])
@pytest.mark.parametrize("quantization", ["q8_0", "q4_k"])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("n_threads", [1, 2])
def test_a_prefill_step_in_c_gives_the_loops_bits(tiny_models: dict[str, Path], name: str, quantization: str,
                                                  schedule: str, n_threads: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    model = Model.from_dir(tiny_models[name], quantization=quantization)
    steps = SCHEDULES[schedule]
    in_c, loop, calls = both_ways(model, steps, monkeypatch, n_threads)
    assert_same_bits(in_c, loop)
    assert calls == [sum(s) for s in steps]   # every step in C


@pytest.mark.parametrize("kv,name", [("f16", "tiny-llama"), ("bf16", "tiny-llama"), ("f16", "tiny-gemma3"),
                                     ("bf16", "tiny-gemma3"), ("q8_0", "tiny-gemma3")])   # q8_0: heads of 32
def test_every_kv_format(tiny_models: dict[str, Path], kv: str, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = Model.from_dir(tiny_models[name], quantization="q8_0")
    steps = SCHEDULES["many-after-cached"]
    in_c, loop, calls = both_ways(model, steps, monkeypatch, 2, kv)
    assert_same_bits(in_c, loop)
    assert len(calls) == len(steps)


def test_a_long_chunk_on_three_threads(tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """512 rows (eight tiles) of one sequence, then a second chunk over its cached pages."""
    model = Model.from_dir(tiny_models["tiny-qwen2"], quantization="q4_k")
    steps = [[512], [100]]
    in_c, loop, calls = both_ways(model, steps, monkeypatch, 3)
    assert_same_bits(in_c, loop)
    assert calls == [512, 100]


def test_float_matrices_past_decode_rows_run_the_loop(tiny_models: dict[str, Path],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 matrices go to BLAS for more than DECODE_ROWS rows, which the C step does not call: such a
    step runs the loop, a shorter one runs in C (the plain float tile), with the same bits either way."""
    model = Model.from_dir(tiny_models["tiny-llama"])
    steps = [[30, 0], [70, 20], [1, 1]]
    in_c, loop, calls = both_ways(model, steps, monkeypatch, 2)
    assert_same_bits(in_c, loop)
    assert calls == [30, 2]


def test_float_activations_run_the_loop_past_decode_rows(tiny_models: dict[str, Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """With activations "float", packed matrices take BLAS on decoded rows for a long chunk: the loop."""
    model = Model.from_dir(tiny_models["tiny-llama"], quantization="q8_0")
    before = matmul.lib.dot_variant(-1)  # type: ignore[union-attr]
    matmul.lib.dot_variant(0)  # type: ignore[union-attr]
    try:
        in_c, loop, calls = both_ways(model, [[70], [20]], monkeypatch, 2)
    finally:
        matmul.lib.dot_variant(before)  # type: ignore[union-attr]
    assert_same_bits(in_c, loop)
    assert calls == [20]
