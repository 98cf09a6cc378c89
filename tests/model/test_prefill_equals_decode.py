"""A token's logits do not depend on how it reached the model: prefilled in one chunk, in chunks of any
size, decoded one token a step, or prefilled beside another sequence's decode tokens. The integer
matmuls give a row the same bits at any row count (test_packed.py) and attention gives a token decode's
arithmetic in prefill too (csrc/attention.c), so the whole forward pass must give the same bits: for
both activation modes, every KV format, Gemma 3's sliding windows, and the pool's threads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers.schedule import run_schedule
from nvllm.model.decoder import Model
from nvllm.model.kernels import matmul, ops, threads
from nvllm.model.quant.kv_format import by_name

pytestmark = [pytest.mark.aarch64,
              pytest.mark.skipif(matmul.lib is None or ops.lib is None, reason="the C kernels are not built")]

N = 37   # tokens: past two pages of 16, so chunks and pages fall differently

SCHEDULES = {
    "one chunk": [[N]],
    "chunks 5, 11, 21": [[5], [11], [21]],
    "chunks of 16 on the pages": [[16], [16], [5]],
    "decoded": [[1]] * N,
    "prefill of 30, then decoded": [[30]] + [[1]] * 7,
}


def assert_same(got: np.ndarray, want: np.ndarray, how: str) -> None:
    bad = np.flatnonzero(~(got == want).all(axis=1))
    assert not bad.size, f"{how}: positions {bad.tolist()} differ, by up to {np.abs(got - want).max():.3g}"


def check_every_schedule(model: Model, kv: str) -> None:
    ids = np.random.default_rng(3).integers(0, model.config.vocab_size, N)
    fmt = by_name(kv)
    want = run_schedule(model, [ids], SCHEDULES["one chunk"], fmt=fmt)[0]
    assert np.isfinite(want).all()
    for how, steps in SCHEDULES.items():
        assert_same(run_schedule(model, [ids], steps, fmt=fmt)[0], want, how)
    # beside another sequence: its prefill in the same steps as this one's decode tokens, and the reverse
    other = np.random.default_rng(4).integers(0, model.config.vocab_size, 24)
    mixed = [[20, 0], [1, 12], [1, 12], [15, 0]]
    assert_same(run_schedule(model, [ids, other], mixed, fmt=fmt)[0], want, "beside another sequence")


@pytest.fixture
def two_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool's threads share the tasks out (whichever thread takes a tile, the bits are the same)."""
    monkeypatch.setattr(threads, "count", 2)


@pytest.mark.parametrize("activations", ["exact", "int8"])
@pytest.mark.parametrize("kv", ["f32", "f16", "q8_0"])
def test_smollm2_logits_are_the_same_prefilled_or_decoded(smollm2_gguf: Path, activations: str, kv: str,
                                                           keep_int_variant, two_threads) -> None:
    from nvllm.model.weights.gguf_file import read_gguf
    from nvllm.model.weights.gguf_weights import load_gguf_weights

    g = read_gguf(smollm2_gguf)
    model = Model(g.config, load_gguf_weights(g))
    matmul.set_activations(activations)
    check_every_schedule(model, kv)


@pytest.mark.parametrize("activations", ["exact", "int8"])
@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-qwen3"])
def test_quantized_tiny_models_give_the_same_logits_prefilled_or_decoded(tiny_models: dict[str, Path], name: str,
                                                                         activations: str, keep_int_variant,
                                                                         two_threads) -> None:
    model = Model.from_dir(tiny_models[name], quantization="q8_0")
    if name == "tiny-gemma3":   # windows shorter than the prompt, so some tokens see only part of it
        assert model.config.sliding_window is not None and model.config.sliding_window < N
    matmul.set_activations(activations)
    check_every_schedule(model, "f16")
