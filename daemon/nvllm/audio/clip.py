"""An upload's bytes -> 16 kHz mono float32 samples: WAV (8/16/24/32-bit PCM, float, A-law, mu-law), FLAC, OGG
Vorbis and Opus, MP3.

Decoded by libsndfile (soundfile's wheels bundle it with its MP3 and Opus decoders, for x86_64 and aarch64
alike) from memory, resampled by soxr (HQ), channels mixed down by their mean. The header is checked first
(headers.py: not audio, cut short, too long, no channels or rate, a codec not read here), then the audio is
decoded in blocks of at most a mebibyte and resampled as it comes, so a file claiming less than it holds is
stopped at max_seconds, and what is allocated is a block and twice the 16 kHz samples kept (the blocks' and
their concatenation), whatever the header claims.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from nvllm.audio.audio_error import AudioError
from nvllm.audio.claims import duration, too_long
from nvllm.audio.headers import read_header

if TYPE_CHECKING:
    import soundfile as sf

__all__ = ["SAMPLE_RATE", "AudioError", "AudioInfo", "decode", "probe"]

SAMPLE_RATE = 16000
BLOCK_SAMPLES = 1 << 18              # samples (frames x channels) decoded at a time: 1 MiB of float32
# libsndfile's names of what each container may be; FLAC's and MP3's subtypes are all read
FORMATS = {"WAV": ("WAV", "WAVEX"), "FLAC": ("FLAC",), "OGG": ("OGG",), "MP3": ("MP3",)}
MP3_SLACK = 1152                     # one MPEG frame: a VBR tag's count may differ from mpg123's by a frame
UNKNOWN_FRAMES = 1 << 62             # libsndfile's count of a file that does not say its length


@dataclass(frozen=True)
class AudioInfo:
    format: str        # libsndfile's name: WAV, WAVEX, FLAC, OGG, MP3
    subtype: str       # its encoding: PCM_16, FLOAT, VORBIS, OPUS, MPEG_LAYER_III, ...
    rate: int          # the file's own sample rate
    channels: int
    frames: int        # as its header says (MP3 without a VBR tag: mpg123's estimate from the size)

    @property
    def seconds(self) -> float:
        return self.frames / self.rate


def _said(e: Exception) -> str:
    """libsndfile's own words for a failure, where they help."""
    words = getattr(e, "error_string", "") or str(e)
    return "" if "does not exist" in words or not words else f" (libsndfile: {words})"


def _check_limit(max_seconds: float | None) -> None:
    if max_seconds is not None and not max_seconds > 0:
        raise ValueError(f"max_seconds must be positive, got {max_seconds}")


def _open(data: bytes, max_seconds: float | None) -> tuple[sf.SoundFile, bool]:
    """The file opened by libsndfile once its header passed, and whether its frame count is exact."""
    import soundfile  # imported on a first upload: with soxr and cffi, which a daemon without speech never needs

    header = read_header(data, max_seconds)
    try:
        f = soundfile.SoundFile(io.BytesIO(data))
    except (RuntimeError, ValueError, TypeError) as e:
        raise AudioError(f"a malformed or truncated {header.container} file{_said(e)}") from None
    try:
        if f.format not in FORMATS[header.container]:
            raise AudioError(f"a {header.container} file that libsndfile reads as {f.format}")
        if f.channels <= 0 or f.samplerate <= 0:
            raise AudioError("the file says zero channels or a sample rate of zero")
        counted = f.frames / f.samplerate if f.frames < UNKNOWN_FRAMES else None
        if counted is not None and max_seconds is not None and counted > max_seconds:
            raise too_long(counted, max_seconds, claimed=True)
        # libsndfile counts an OGG by its pages and an MP3 by mpg123's reckoning, not always as the header
        # says: where they disagree the file was tampered with or damaged (a tag's delay and padding: < 1 s)
        if counted is not None and header.seconds is not None and \
                abs(counted - header.seconds) > 1.0 + 0.01 * header.seconds:
            raise AudioError(f"a malformed {header.container} file: its header says {duration(header.seconds)} "
                             f"of audio, its stream {duration(counted)}")
    except BaseException:
        f.close()
        raise
    return f, header.exact and f.frames < UNKNOWN_FRAMES


def _info(f: sf.SoundFile) -> AudioInfo:
    return AudioInfo(f.format, f.subtype, f.samplerate, f.channels, f.frames)


def probe(data: bytes, max_seconds: float | None = None) -> AudioInfo:
    """What the file is and how long it says it is, from its header alone (bounded work: no audio decoded);
    AudioError if it is refused."""
    _check_limit(max_seconds)
    f, _ = _open(data, max_seconds)
    with f:
        return _info(f)


def decode(data: bytes, max_seconds: float | None = None) -> np.ndarray:
    """The file's samples as float32 mono at 16 kHz in [-1, 1]; AudioError if it is refused, whether by its
    header or while decoding (cut short, corrupt, longer than max_seconds, samples not finite)."""
    _check_limit(max_seconds)
    f, exact = _open(data, max_seconds)
    with f:
        info = _info(f)
        block = max(1, BLOCK_SAMPLES // info.channels)
        limit = None if max_seconds is None else int(max_seconds * info.rate)
        import soxr

        stream = None if info.rate == SAMPLE_RATE else \
            soxr.ResampleStream(info.rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")
        buffer = np.empty((block, info.channels), np.float32)
        parts, total = [], 0
        while True:
            want = block if limit is None else min(block, limit + 1 - total)
            try:
                # into a buffer: soundfile's read without one asks libsndfile where it is, and a FLAC file
                # that does not say its length cannot answer
                chunk = f.read(out=buffer[:want])
            except (RuntimeError, ValueError) as e:
                raise AudioError(f"a corrupt or truncated {info.format} file{_said(e)}") from None
            if not len(chunk):
                break
            total += len(chunk)
            if limit is not None and total > limit:
                assert max_seconds is not None
                raise too_long(total / info.rate, max_seconds, claimed=False)
            if not np.isfinite(chunk).all():
                raise AudioError("the samples are not all finite numbers (NaN or infinity)")
            mono = chunk[:, 0].copy() if info.channels == 1 else chunk.mean(axis=1, dtype=np.float32)
            parts.append(mono if stream is None else stream.resample_chunk(mono))
    if total == 0:
        raise AudioError("no audio: the file holds no samples")
    slack = MP3_SLACK if info.format == "MP3" else 0
    if exact and total < info.frames - slack:
        raise AudioError(f"truncated: the header claims {info.frames} frames ({info.seconds:.1f} s), the file holds "
                         f"{total} ({total / info.rate:.1f} s)")
    if stream is not None:
        parts.append(stream.resample_chunk(np.zeros(0, np.float32), last=True))
    samples = np.concatenate(parts)
    return np.clip(samples, -1.0, 1.0, out=samples)
