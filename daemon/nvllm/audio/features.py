"""Whisper's log-mel front end: 16 kHz samples -> [n_mels, frames] features, as transformers'
WhisperFeatureExtractor computes them (its NumPy path) within float32 rounding.

A centred STFT (400-sample periodic Hann window, hop 160, the signal reflect-padded by 200 on each side),
the power spectrum, Slaney-normalised mel filters on the Slaney mel scale up to 8 kHz, log10 clamped at
1e-10, every value floored at the maximum minus 8, then (x + 4) / 4. The STFT's last frame is dropped, so
a clip of n samples has n // 160 frames; a 30-s chunk has 3000.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
CHUNK_SAMPLES = 30 * SAMPLE_RATE            # Whisper's window: 30 s
CHUNK_FRAMES = CHUNK_SAMPLES // HOP         # 3000
FREQ_BINS = N_FFT // 2 + 1                  # 201

# periodic Hann: the symmetric window of N + 1 points without its last
WINDOW = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT))


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above (27 mels per factor 6.4)."""
    linear = 3.0 * hz / 200.0
    log = 15.0 + np.log(np.maximum(hz, 1e-12) / 1000.0) * 27.0 / np.log(6.4)
    return np.where(hz >= 1000.0, log, linear)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    linear = 200.0 * mel / 3.0
    log = 1000.0 * np.exp((mel - 15.0) * np.log(6.4) / 27.0)
    return np.where(mel >= 15.0, log, linear)


@cache
def mel_filters(n_mels: int) -> np.ndarray:
    """[FREQ_BINS, n_mels] float64: triangles between evenly spaced mel points from 0 Hz to 8 kHz, each scaled
    by 2 / its width in Hz (Slaney's equal-area normalisation). Read-only: it is shared."""
    edges = _mel_to_hz(np.linspace(0.0, float(_hz_to_mel(np.array(8000.0))), n_mels + 2))
    freqs = np.linspace(0.0, SAMPLE_RATE // 2, FREQ_BINS)[:, None]
    low, centre, high = edges[:-2], edges[1:-1], edges[2:]
    rising = (freqs - low) / (centre - low)
    falling = (high - freqs) / (high - centre)
    filters = np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (high - low))
    filters.setflags(write=False)
    return filters


def log_mel(samples: np.ndarray, n_mels: int = 80, pad_to_chunk: bool = True) -> np.ndarray:
    """[n_mels, frames] float32 log-mel features of 16 kHz mono samples.

    pad_to_chunk: the samples cut or zero-padded to 30 s first -> [n_mels, 3000], as the extractor's default
    (padding="max_length"); otherwise the whole clip, n // 160 frames (padding="longest", truncation=False),
    which is [n_mels, 0] for a clip shorter than one hop.
    """
    x = np.asarray(samples, dtype=np.float32)   # the extractor's own cast: it rounds float64 input too
    if x.ndim != 1:
        raise ValueError(f"log_mel takes mono samples, a 1-D array; got shape {x.shape}")
    heard = len(x)
    if pad_to_chunk:
        x = np.pad(x[:CHUNK_SAMPLES], (0, max(0, CHUNK_SAMPLES - len(x))))
    frames = len(x) // HOP
    if frames == 0:
        return np.zeros((n_mels, 0), np.float32)
    # A frame wholly in the zero padding has no power: its log is the clamp's, log10(1e-10) = -10, with no
    # transform (a 3-s question is a tenth of a chunk). Frame t spans samples t*HOP - 200 .. t*HOP + 199.
    live = min(frames, -(-(heard + N_FFT // 2) // HOP))
    # Only the frames computed (the reference computes one more and drops it); the cut keeps every sample
    # they read, and the whole clip where they are all of them.
    padded = np.pad(x[:live * HOP + N_FFT], N_FFT // 2, mode="reflect")
    windows = sliding_window_view(padded, N_FFT)[::HOP][:live]
    # float64 from here to the log, as the reference: it keeps the features within one float32 step of the
    # reference's (a float32 transform drifts to 6e-6 on speech: a quiet bin's power far below its frame's
    # loudest is lost in float32 rounding, and the floor keeps 8 decades), and a whole chunk costs ~10 ms.
    spectrum = np.fft.rfft(windows * WINDOW, axis=1)
    power = np.square(spectrum.real) + np.square(spectrum.imag)
    mel = power @ mel_filters(n_mels)
    log = np.full((frames, n_mels), -10.0, np.float32)
    log[:live] = np.log10(np.maximum(mel, 1e-10))
    np.maximum(log, log.max() - np.float32(8.0), out=log)
    log += np.float32(4.0)
    log /= np.float32(4.0)
    return np.ascontiguousarray(log.T)
