"""Whisper's encoder shares its own work out over the kernels' thread count (whisper_encoder.py: the attention's
tiles and a float matrix's rows, BLAS held to one thread by threads.blas_one_thread): the states at 1, 2 and 3
threads are the one-thread states, and BLAS's thread count is as it was afterwards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from nvllm.model.kernels import threads
from nvllm.model.whisper import load_whisper
from nvllm.model.whisper_encoder import encode_states


def blas_threads() -> list[int]:
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


@pytest.fixture
def restore_threads():
    before = threads.count
    yield
    threads.configure(before)


@pytest.mark.parametrize("name", ["tiny-whisper", "tiny-whisper-f16"])
def test_the_states_are_the_same_at_any_thread_count(tiny_whispers: dict[str, Path], name: str,
                                                     restore_threads) -> None:
    w, _ = load_whisper(tiny_whispers[name])
    c = w.config
    features = np.random.default_rng(3).standard_normal((c.num_mel_bins, c.num_frames)).astype(np.float32)
    threads.configure(1)
    one = encode_states(w.weights, c, features)
    for n in (2, 3):
        threads.configure(n)
        assert blas_threads() and set(blas_threads()) == {n}
        got = encode_states(w.weights, c, features)
        assert set(blas_threads()) == {n}          # the encoder's limit is taken off on the way out
        np.testing.assert_allclose(got, one, rtol=0, atol=2e-5)


def test_blas_runs_on_one_thread_inside_and_as_before_after(restore_threads) -> None:
    threads.configure(2)
    with threads.blas_one_thread():
        assert set(blas_threads()) == {1}
    assert set(blas_threads()) == {2}
