"""A Whisper token's logits do not depend on how it reached the decoder: its prompt prefilled whole, in chunks
across pages, decoded a token a step, or packed beside another sequence (prefill or decode rows) attending to
another window. With the matrices in the kernels' formats (F16 as stored, q8_0 at load) a row gets the same bits at
any row count, and attention gives a row decode's arithmetic in prefill too, so the logits are the same bits;
float32 matrices go to BLAS for one row and to the C tile for a few, so there they agree within float rounding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers.whisper_models import features
from helpers.whisper_steps import run_steps
from nvllm.model.decoder import ForwardBatch
from nvllm.model.kernels import matmul, ops, threads
from nvllm.model.quant.kv_format import by_name
from nvllm.model.whisper import load_whisper

N = 37   # past two pages of 16

SCHEDULES = {
    "chunks 5, 11, 21": [[5], [11], [21]],
    "chunks of 16 on the pages": [[16], [16], [5]],
    "decoded": [[1]] * N,
    "prefill of 30, then decoded": [[30]] + [[1]] * 7,
}


@pytest.fixture
def two_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "count", 2)


@pytest.mark.skipif(matmul.lib is None or ops.lib is None, reason="the C kernels are not built")
@pytest.mark.parametrize("kv", ["f32", "f16"])
@pytest.mark.parametrize("name, quantization, tol", [("tiny-whisper-f16", "", 0.0), ("tiny-whisper-multi", "q8_0", 0.0),
                                                     ("tiny-whisper", "", 1e-4)])
def test_logits_are_the_same_however_the_tokens_arrive(tiny_whispers: dict[str, Path], name: str, quantization: str,
                                                       tol: float, kv: str, two_threads: None) -> None:
    model, _ = load_whisper(tiny_whispers[name], quantization)
    model.cross_format = by_name(kv)
    fmt = by_name(kv)
    mels = model.config.num_mel_bins
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 50000, N), rng.integers(0, 50000, 24)
    win_a, win_b = model.encode(features(mels, 0)), model.encode(features(mels, 1))
    want = run_steps(model, [win_a], [a], [[N]], fmt=fmt)[0]
    want_b = run_steps(model, [win_b], [b], [[24]], fmt=fmt)[0]
    assert np.isfinite(want).all()

    def same(got: np.ndarray, ref: np.ndarray, how: str) -> None:
        err = float(np.abs(got - ref).max())
        assert err <= tol, f"{how}: logits differ by up to {err:.3g}"

    for how, steps in SCHEDULES.items():
        same(run_steps(model, [win_a], [a], steps, fmt=fmt)[0], want, how)
    # beside another sequence with another window: its prefill in the steps of this one's decode rows, and back
    pair = run_steps(model, [win_a, win_b], [a, b], [[20, 0], [1, 12], [1, 12], [15, 0]], fmt=fmt)
    same(pair[0], want, "beside another sequence")
    same(pair[1], want_b, "the other sequence")
    both = run_steps(model, [win_b, win_a], [b, a], [[24, N]], fmt=fmt)
    same(both[1], want, "prefilled in one batch with another")
    same(both[0], want_b, "the other, prefilled in one batch")


def test_the_windows_are_not_mixed_up(tiny_whispers: dict[str, Path]) -> None:
    """The same prompt under two windows gives two answers, each the one it gets alone."""
    model, _ = load_whisper(tiny_whispers["tiny-whisper-v3"])
    prompt = np.random.default_rng(4).integers(0, 50000, 9)
    windows = [model.encode(features(128, k)) for k in (0, 1)]
    alone = [run_steps(model, [w], [prompt], [[9]])[0] for w in windows]
    assert np.abs(alone[0] - alone[1]).max() > 0.1
    together = run_steps(model, windows, [prompt, prompt], [[4, 4], [5, 1], [0, 4]])
    for got, want in zip(together, alone):
        assert np.abs(got - want).max() <= 2e-5


def test_cross_keys_and_values_are_the_encoders_projections(tiny_whispers: dict[str, Path]) -> None:
    """CrossKV.k(l), v(l) are k_proj and v_proj (+ v's bias; k has none) of the encoder's states."""
    from nvllm.model.whisper_encoder import encode_states

    model, _ = load_whisper(tiny_whispers["tiny-whisper"])
    f = features(80, 0)
    states = encode_states(model.weights, model.config, f)
    cross = model.encode(f)
    d = model.config.d_model
    assert cross.frames == 1500 and len(cross.layers) == model.config.decoder_layers
    for n, layer in enumerate(model.weights.decoder_layers):
        w = layer.cross.kv.dequantize()
        assert np.abs(cross.k(n) - states @ w[:d].T).max() <= 1e-4
        assert np.abs(cross.v(n) - (states @ w[d:].T + layer.cross.kv_bias[d:])).max() <= 1e-4


def test_what_the_model_cannot_take_is_refused(tiny_whispers: dict[str, Path]) -> None:
    model, _ = load_whisper(tiny_whispers["tiny-whisper"])
    with pytest.raises(ValueError, match=r"features: need \[80, 3000\]"):
        model.encode(np.zeros((128, 3000), np.float32))
    bad = features(80, 0)
    bad[3, 7] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        model.encode(bad)
    window = model.encode(features(80, 0))
    prompt = np.arange(449) % 1000
    with pytest.raises(ValueError, match="up to 448 tokens"):
        run_steps(model, [window], [prompt], [[449]])
    cache = model.make_kv_cache(2, 16)
    batch = ForwardBatch.build(prompt[:5], np.arange(5), np.arange(5), np.array([5]), np.array([5]),
                               np.zeros((1, 1), np.int32), np.array([4]))
    with pytest.raises(ValueError, match="one CrossKV per sequence"):
        model.forward(batch, cache, [window, window])
