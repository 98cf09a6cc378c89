"""Whisper's log-mel features against transformers' WhisperFeatureExtractor (its NumPy path), from
tests/golden/whisper/features_*.npz (tools/whisper_goldens_audio.py): the speech clips, 80 and 128 bins, a
30-s chunk and the whole clip, short noise and a clip longer than the chunk.

Within float32 rounding: every compared value within ATOL of the reference (measured: 1.2e-7, one float32
step near 1.0, on every clip), the checksums of what is not stored whole within their count times that."""

from __future__ import annotations

import json
import time
from functools import cache

import numpy as np
import pytest

from helpers.paths import GOLDEN
from nvllm.audio.features import CHUNK_FRAMES, CHUNK_SAMPLES, HOP, log_mel, mel_filters

ATOL = 1e-5
CLIPS = ("jfk", "capital", "battery", "return")
MELS = (80, 128)


@cache
def golden(name: str) -> dict[str, np.ndarray]:
    with np.load(GOLDEN / "whisper" / f"features_{name}.npz") as f:
        return {k: f[k] for k in f.files}


def check_slices(got: np.ndarray, want: dict[str, np.ndarray], key: str, samples: int, chunk: bool) -> None:
    """`got` against the golden's slices and checksums under `key` (as tools/whisper_goldens_audio.py keeps them)."""
    n, frames = got.shape
    np.testing.assert_allclose(got.sum(axis=0, dtype=np.float64), want[f"{key}_frame_sums"], rtol=0, atol=n * ATOL)
    np.testing.assert_allclose(got.sum(axis=1, dtype=np.float64), want[f"{key}_bin_sums"], rtol=0,
                               atol=frames * ATOL)
    if chunk:
        edge = min(max(0, samples // HOP - 10), frames - 20)
        parts = {"head": got[:, :50], "edge": got[:, edge:edge + 20]}
    else:
        assert tuple(want[f"{key}_shape"]) == got.shape
        mid = max(0, frames // 2 - 50)
        parts = {"head": got[:, :100], "mid": got[:, mid:mid + 100], "tail": got[:, -20:]}
    for part, values in parts.items():
        np.testing.assert_allclose(values, want[f"{key}_{part}"], rtol=0, atol=ATOL, err_msg=f"{key}_{part}")


@pytest.mark.parametrize("clip", CLIPS)
@pytest.mark.parametrize("n_mels", MELS)
def test_the_features_of_a_speech_clip_equal_the_reference(speech, clip, n_mels) -> None:
    x = speech(clip)
    want = golden(clip)
    chunk = log_mel(x, n_mels)
    assert chunk.shape == (n_mels, CHUNK_FRAMES) and chunk.dtype == np.float32
    check_slices(chunk, want, f"{n_mels}_chunk", len(x), chunk=True)
    whole = log_mel(x, n_mels, pad_to_chunk=False)
    assert whole.shape == (n_mels, len(x) // HOP) and whole.dtype == np.float32
    check_slices(whole, want, f"{n_mels}_whole", len(x), chunk=False)


@pytest.mark.parametrize("length", [160, 333, 4000])
@pytest.mark.parametrize("n_mels", MELS)
def test_short_noise_equals_the_reference_whole(length, n_mels) -> None:
    """One hop (the reflect padding longer than the clip), a part hop, a quarter second."""
    want = golden("edges")
    got = log_mel(want[f"noise{length}_input"], n_mels, pad_to_chunk=False)
    assert got.shape == (n_mels, length // HOP)
    np.testing.assert_allclose(got, want[f"noise{length}_{n_mels}_whole"], rtol=0, atol=ATOL)


@pytest.mark.parametrize("n_mels", MELS)
def test_a_clip_longer_than_a_chunk_is_cut_to_30_s_or_kept_whole(speech, n_mels) -> None:
    x = np.tile(speech("jfk"), 3)       # 33 s
    want = golden("edges")
    check_slices(log_mel(x, n_mels), want, f"jfk3_{n_mels}_chunk", len(x), chunk=True)
    whole = log_mel(x, n_mels, pad_to_chunk=False)
    assert whole.shape == (n_mels, 3300)
    check_slices(whole, want, f"jfk3_{n_mels}_whole", len(x), chunk=False)


def test_the_goldens_say_what_made_them() -> None:
    meta = json.loads(str(golden("jfk")["meta"]))
    assert meta["reference"] == "WhisperFeatureExtractor._np_extract_fbank_features"
    assert meta["samples"] == 176000 and "transformers" in meta


def test_shorter_than_a_hop_has_no_frames_and_silence_is_flat() -> None:
    assert log_mel(np.zeros(100, np.float32), pad_to_chunk=False).shape == (80, 0)
    assert log_mel(np.zeros(0, np.float32), 128, pad_to_chunk=False).shape == (128, 0)
    silent = log_mel(np.zeros(0, np.float32))
    assert silent.shape == (80, CHUNK_FRAMES)
    assert np.all(silent == np.float32((-10.0 + 4) / 4))      # log10 of the 1e-10 clamp, scaled


def test_float64_samples_are_rounded_to_float32_first_as_the_extractor_does(speech) -> None:
    x = speech("battery")
    noisy = x.astype(np.float64) * (1 + 1e-12)     # within half a float32 step of every sample
    np.testing.assert_array_equal(log_mel(noisy), log_mel(x))


def test_stereo_is_refused_and_the_filters_are_cached_read_only() -> None:
    with pytest.raises(ValueError, match="mono samples"):
        log_mel(np.zeros((2, 16000), np.float32))
    assert mel_filters(80) is mel_filters(80) and mel_filters(128).shape == (201, 128)
    assert not mel_filters(80).flags.writeable


def test_a_chunk_of_speech_takes_milliseconds(speech) -> None:
    """A whole chunk of speech (no silence to skip): ~10 ms here; the bound is for a Python loop over frames."""
    x = np.tile(speech("jfk"), 3)[:CHUNK_SAMPLES]
    best = min(_timed(x) for _ in range(3))
    assert best < 0.25, best


def _timed(x: np.ndarray) -> float:
    start = time.perf_counter()
    log_mel(x)
    return time.perf_counter() - start
