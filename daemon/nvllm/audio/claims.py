"""What a header claims, checked the same way for every container: its channels, rate and length against the
limits; and the refusals' words (a length, a cut-short file)."""

from __future__ import annotations

from dataclasses import dataclass

from nvllm.audio.audio_error import AudioError

SUPPORTED = "WAV, FLAC, OGG (Vorbis or Opus) and MP3"
MIN_RATE, MAX_RATE = 1000, 384000     # below 1 kHz no speech survives; the floor also bounds the resampler's output
MAX_CHANNELS = 1024                   # libsndfile's own limit
MAX_BLOCKS = 256                      # metadata blocks, chunks or ID3 tags walked before the audio


@dataclass(frozen=True)
class Header:
    container: str            # what libsndfile must find: WAV, FLAC, OGG or MP3
    seconds: float | None     # the length the header claims, where it claims one
    exact: bool               # decoding fewer frames than libsndfile's count means the file was cut short


def duration(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def too_long(seconds: float, max_seconds: float, claimed: bool) -> AudioError:
    if not claimed:     # decoding stopped at the limit: how much more there was is not known
        return AudioError(f"the file holds more than the {max_seconds:g} s of audio allowed")
    return AudioError(f"the header claims {duration(seconds)} of audio, more than the {max_seconds:g} s allowed")


def truncated(what: str, claimed: int, sent: int) -> AudioError:
    return AudioError(f"truncated: {what} claims {claimed} bytes, {sent} were sent")


def claims(channels: int, rate: int, seconds: float | None, max_seconds: float | None) -> None:
    """Refuses a header's claims that no decoding could honour: no channels, no rate, a rate out of range, a
    length over the limit."""
    if channels == 0:
        raise AudioError("the header says zero channels")
    if channels > MAX_CHANNELS:
        raise AudioError(f"the header says {channels} channels, more than {MAX_CHANNELS}")
    if rate == 0:
        raise AudioError("the header says a sample rate of zero")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioError(f"a sample rate of {rate} Hz is out of range ({MIN_RATE} to {MAX_RATE} Hz)")
    if seconds is not None and max_seconds is not None and seconds > max_seconds:
        raise too_long(seconds, max_seconds, claimed=True)
