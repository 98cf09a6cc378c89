"""A WAV file's RIFF chunks walked up to its data chunk: the fmt chunk's codec, channels, rate and sample
width, and the data chunk's size against the bytes sent (libsndfile would quietly read what is there)."""

from __future__ import annotations

from nvllm.audio.audio_error import AudioError
from nvllm.audio.claims import MAX_BLOCKS, Header, claims, too_long, truncated

# WAVE format tags read here -> the sample widths each may have
READ = {1: ("PCM", (8, 16, 24, 32)), 3: ("IEEE float", (32, 64)), 6: ("A-law", (8,)), 7: ("mu-law", (8,))}
# a few that are not, named in the refusal
NAMED = {2: "Microsoft ADPCM", 0x11: "IMA ADPCM", 0x31: "GSM 6.10", 0x50: "MPEG", 0x55: "MPEG Layer III",
         0xFF: "AAC", 0x161: "Windows Media Audio", 0x2000: "AC-3"}
EXTENSIBLE = 0xFFFE
UNKNOWN_SIZE = 0xFFFFFFFF             # a streaming writer's data size: to the end of the file


def _u16(data: bytes, at: int) -> int:
    return int.from_bytes(data[at:at + 2], "little")


def _u32(data: bytes, at: int) -> int:
    return int.from_bytes(data[at:at + 4], "little")


def _frame_bytes(fmt: bytes, max_seconds: float | None) -> tuple[int, int]:
    """(bytes per frame, rate) of a fmt chunk's body, its codec and claims checked."""
    tag, channels, rate, bits = _u16(fmt, 0), _u16(fmt, 2), _u32(fmt, 4), _u16(fmt, 14)
    if tag == EXTENSIBLE and len(fmt) >= 26:
        tag = _u16(fmt, 24)                       # the sub-format GUID's first two bytes are the real tag
    if tag not in READ:
        name = NAMED.get(tag, "an unknown codec")
        raise AudioError(f"WAV with {name} (format tag 0x{tag:04x}) is not supported; PCM, float, A-law and mu-law "
                         "are")
    codec, widths = READ[tag]
    if bits not in widths:
        raise AudioError(f"WAV {codec} with {bits} bits per sample is not supported")
    claims(channels, rate, None, max_seconds)
    return channels * bits // 8, rate


def wav_header(data: bytes, max_seconds: float | None) -> Header:
    pos, frame = 12, None
    for _ in range(MAX_BLOCKS):
        if pos + 8 > len(data):
            raise AudioError("truncated: the WAV file ends before its data chunk" if frame else
                             "truncated: the WAV file ends before its fmt chunk")
        kind, size, body = data[pos:pos + 4], _u32(data, pos + 4), pos + 8
        if kind == b"data":
            if frame is None:
                raise AudioError("a WAV file whose data chunk comes before its fmt chunk")
            sent = len(data) - body
            size = sent if size == UNKNOWN_SIZE else size
            seconds = size // frame[0] / frame[1]
            if max_seconds is not None and seconds > max_seconds:
                raise too_long(seconds, max_seconds, claimed=True)
            if size > sent:
                raise truncated("the WAV data chunk", size, sent)
            if size < frame[0]:
                raise AudioError("no audio: the WAV data chunk is empty")
            return Header("WAV", seconds, exact=True)
        if body + size > len(data):
            raise truncated(f"the WAV {kind.decode('latin-1')!r} chunk", size, len(data) - body)
        if kind == b"fmt ":
            if size < 16:
                raise AudioError(f"a malformed WAV fmt chunk of {size} bytes")
            frame = _frame_bytes(data[body:body + size], max_seconds)
        pos = body + size + (size & 1)            # chunks are padded to an even length
    raise AudioError("too many WAV chunks before the data chunk")
