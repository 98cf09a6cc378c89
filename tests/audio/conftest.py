"""What the audio tests share: the committed speech clips (tests/data/speech/) and other encodings of them made
at test time by soundfile, and WAV files built chunk by chunk to lie in their headers."""

from __future__ import annotations

import io
import struct
import wave
from collections.abc import Callable
from functools import cache

import numpy as np
import pytest
import soundfile as sf

from helpers.paths import TESTS

SPEECH = TESTS / "data" / "speech"


@cache
def _speech(name: str) -> np.ndarray:
    """A committed clip's samples as int16 / 32768, read by the standard library (not by what is tested)."""
    with wave.open(str(SPEECH / f"{name}.wav")) as w:
        assert (w.getframerate(), w.getsampwidth(), w.getnchannels()) == (16000, 2, 1)
        samples = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    samples.setflags(write=False)
    return samples


def _encode(samples: np.ndarray, rate: int, format: str, subtype: str) -> bytes:
    """The samples ([frames] or [frames, channels]) as a file in memory, written a second at a time
    (libsndfile's Vorbis encoder crashes on very long single writes)."""
    out = io.BytesIO()
    channels = 1 if samples.ndim == 1 else samples.shape[1]
    with sf.SoundFile(out, "w", rate, channels, format=format, subtype=subtype) as f:
        for i in range(0, len(samples), rate):
            f.write(samples[i:i + rate])
    return out.getvalue()


def _riff(*chunks: tuple[bytes, bytes] | tuple[bytes, bytes, int]) -> bytes:
    """A RIFF WAVE file of the given (id, body[, size claimed]) chunks."""
    parts = []
    for chunk in chunks:
        kind, body = chunk[0], chunk[1]
        size = chunk[2] if len(chunk) == 3 else len(body)
        parts.append(kind + struct.pack("<I", size) + body + b"\0" * (len(body) & 1))
    payload = b"WAVE" + b"".join(parts)
    return b"RIFF" + struct.pack("<I", len(payload)) + payload


def _fmt_chunk(tag: int = 1, channels: int = 1, rate: int = 16000, bits: int = 16) -> tuple[bytes, bytes]:
    block = channels * bits // 8
    return b"fmt ", struct.pack("<HHIIHH", tag, channels, rate, rate * block & 0xFFFFFFFF, block & 0xFFFF, bits)


@pytest.fixture
def speech() -> Callable[[str], np.ndarray]:
    return _speech


@pytest.fixture
def speech_bytes() -> Callable[[str], bytes]:
    return lambda name: (SPEECH / name).read_bytes()


@pytest.fixture
def encode() -> Callable[[np.ndarray, int, str, str], bytes]:
    return _encode


@pytest.fixture
def riff() -> Callable[..., bytes]:
    return _riff


@pytest.fixture
def fmt_chunk() -> Callable[..., tuple[bytes, bytes]]:
    return _fmt_chunk
