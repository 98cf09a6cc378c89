"""What the speech tests send and serve: WAV bytes made here (silence, noise, and headers that lie: no channels,
a claimed length past the bytes sent), the spoken clips of tests/data/speech/, the tiny random Whisper
folders (made on demand by models/make_test_models.py) and the real tiny.en (`nvllm models pull
whisper-tiny.en`; skipped where it is not pulled)."""

from __future__ import annotations

import io
import random
import struct
import wave
from pathlib import Path

import pytest

from helpers.paths import ROOT

MODELS = ROOT / "models"
CLIPS = ROOT / "tests" / "data" / "speech"
REAL = "whisper-tiny.en"


def wav(seconds: float, rate: int = 16000, width: int = 2, channels: int = 1, noise: bool = False,
        seed: int = 0) -> bytes:
    """PCM WAV of silence (or white noise) as Python's wave module writes it."""
    frames = int(seconds * rate)
    if noise:
        rng = random.Random(seed)
        body = bytes(rng.getrandbits(8) for _ in range(frames * width * channels))
    else:
        body = (b"\x80" if width == 1 else bytes(width)) * frames * channels
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(body)
    return out.getvalue()


def wav_header(channels: int = 1, rate: int = 16000, width: int = 2, data_bytes: int = 0, sent: int = 0) -> bytes:
    """A WAV header claiming data_bytes of samples, followed by `sent` bytes of them (a lying header when
    they differ, or when channels or rate is 0)."""
    block = channels * width
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * block, block, 8 * width)
    return (b"RIFF" + struct.pack("<I", 36 + data_bytes) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
            + b"data" + struct.pack("<I", data_bytes) + bytes(sent))


def clip(name: str) -> bytes:
    return (CLIPS / f"{name}.wav").read_bytes()


def tiny_whisper(name: str = "tiny-whisper") -> Path:
    """A tiny random Whisper folder (tiny-whisper: English-only; tiny-whisper-multi: multilingual), made into
    models/ when missing."""
    path = MODELS / name
    if not (path / "config.json").exists():
        import importlib.util
        import sys
        spec = importlib.util.spec_from_file_location("make_test_models", MODELS / "make_test_models.py")
        assert spec is not None and spec.loader is not None
        maker = importlib.util.module_from_spec(spec)
        sys.modules["make_test_models"] = maker
        spec.loader.exec_module(maker)
        maker.make_all(MODELS, only=[name])
    return path


def real_whisper() -> Path:
    """The real tiny.en as `nvllm models pull whisper-tiny.en` leaves it; the test skips where it is not."""
    path = MODELS / REAL
    if not (path / "model.bin").exists():
        pytest.skip(f"the default speech model is not pulled (nvllm models pull {REAL})")
    return path
