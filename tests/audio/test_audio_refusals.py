"""Bad input refused, naming `file` and the reason, quickly and with no allocation the header's claims could
size: not audio, empty, cut short, a header claiming hours or more bytes than were sent, zero channels or
rate, a codec not read. Most are found from the header alone (probe refuses them too); a compressed file cut
mid-stream is found while decoding, in bounded blocks."""

from __future__ import annotations

import struct
import time
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

from nvllm.audio import clip
from nvllm.audio.clip import AudioError, decode, probe

TEN_HOURS = 36000

Make = Callable[..., bytes]


def refused(data: bytes, max_seconds: float | None = None) -> AudioError:
    """decode's refusal of `data`, checked for its form, its time and its allocations."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(AudioError) as caught:
            decode(data, max_seconds=max_seconds)
        took = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    e = caught.value
    assert str(e).startswith("file: ") and e.field == "file" and str(e) == f"file: {e.reason}"
    assert took < 1.0, took
    assert peak < 3 << 20, peak       # a block of samples at most, whatever the header claims
    return e


def check(data: bytes, reason: str, max_seconds: float | None = None, header: bool = True) -> None:
    """Refused with `reason` in its message; by probe too where the header shows it."""
    assert reason in str(refused(data, max_seconds))
    if header:
        with pytest.raises(AudioError, match=reason.replace("(", r"\(").replace(")", r"\)")):
            probe(data, max_seconds=max_seconds)
    else:
        probe(data, max_seconds=max_seconds)


def test_empty_text_and_other_files_are_not_audio(speech, encode) -> None:
    check(b"", "the file is empty")
    check(b"hello, this is not audio " * 40, "not an audio file: WAV, FLAC, OGG (Vorbis or Opus) and MP3 are read")
    check(b"\x89PNG\r\n\x1a\n" + bytes(200), "not an audio file")
    check(b'{"audio": "a JSON body sent as the file"}', "not an audio file")
    check(b"\xff\xfb" + bytes(500), "a malformed or truncated MP3 file")   # an MPEG frame header, then nothing
    check(b"RIFF\x00\x01\x00\x00AVI LIST" + bytes(100), "a RIFF file of type b'AVI ', not WAVE")


@pytest.mark.parametrize("head, name", [
    (b"\x00\x00\x00\x20ftypM4A \x00\x00\x02\x00", "MP4 or M4A (AAC) audio is not supported"),
    (b"\xff\xf1\x50\x80\x02\x1f\xfc", "AAC (ADTS) audio is not supported"),
    (b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81", "WebM or Matroska audio is not supported"),
    (b"caff\x00\x01\x00\x00", "CAF audio is not supported"),
    (b"RF64\xff\xff\xff\xffWAVEds64", "RF64 WAV audio is not supported"),
])
def test_other_audio_containers_are_named(head: bytes, name: str) -> None:
    check(head + bytes(300), name)


def test_aiff_written_by_libsndfile_is_named(speech, encode) -> None:
    check(encode(speech("battery"), 16000, "AIFF", "PCM_16"), "AIFF audio is not supported")


# WAV

def test_a_wav_header_claiming_ten_hours_with_100_bytes_sent(riff, fmt_chunk) -> None:
    data = riff(fmt_chunk(), (b"data", bytes(56), TEN_HOURS * 16000 * 2))
    assert len(data) == 100
    check(data, "the header claims 10:00:00 of audio, more than the 600 s allowed", max_seconds=600)
    check(data, "truncated: the WAV data chunk claims 1152000000 bytes, 56 were sent")
    check(riff(fmt_chunk(), (b"data", bytes(56), 1 << 31)), "truncated: the WAV data chunk claims 2147483648 bytes")


def test_a_wav_cut_short_is_refused_before_decoding(speech_bytes) -> None:
    data = speech_bytes("jfk.wav")
    check(data[:len(data) // 2], "truncated: the WAV data chunk claims 352000 bytes, 175961 were sent")
    check(data[:40], "truncated: the WAV file ends before its data chunk")
    check(data[:30], "truncated: the WAV 'fmt ' chunk claims 16 bytes, 10 were sent")
    check(data[:12], "truncated: the WAV file ends before its fmt chunk")


def test_a_wav_longer_than_max_seconds_is_refused_from_its_header(speech_bytes) -> None:
    check(speech_bytes("jfk.wav"), "the header claims 11.0 s of audio, more than the 5 s allowed", max_seconds=5)


@pytest.mark.parametrize("fields, reason", [
    ({"channels": 0}, "the header says zero channels"),
    ({"rate": 0}, "the header says a sample rate of zero"),
    ({"rate": 500}, "a sample rate of 500 Hz is out of range (1000 to 384000 Hz)"),
    ({"rate": 4_000_000_000}, "a sample rate of 4000000000 Hz is out of range"),
    ({"channels": 2000}, "the header says 2000 channels, more than 1024"),
    ({"bits": 12}, "WAV PCM with 12 bits per sample is not supported"),
    ({"tag": 3, "bits": 16}, "WAV IEEE float with 16 bits per sample is not supported"),
    ({"tag": 0x55}, "WAV with MPEG Layer III (format tag 0x0055) is not supported"),
    ({"tag": 0x1234}, "WAV with an unknown codec (format tag 0x1234) is not supported"),
])
def test_a_wav_fmt_chunk_that_cannot_be_read(riff, fmt_chunk, fields, reason) -> None:
    check(riff(fmt_chunk(**fields), (b"data", bytes(3200))), reason)


def test_a_wav_in_a_codec_libsndfile_reads_but_nvllm_does_not(speech, encode) -> None:
    check(encode(speech("battery"), 16000, "WAV", "IMA_ADPCM"), "WAV with IMA ADPCM (format tag 0x0011)")
    check(encode(speech("battery"), 16000, "WAV", "GSM610"), "WAV with GSM 6.10 (format tag 0x0031)")


def test_a_wav_whose_chunks_are_out_of_order_or_empty(riff, fmt_chunk) -> None:
    check(riff((b"data", bytes(3200)), fmt_chunk()), "a WAV file whose data chunk comes before its fmt chunk")
    check(riff(fmt_chunk()), "truncated: the WAV file ends before its data chunk")
    check(riff(fmt_chunk(), (b"data", b"")), "no audio: the WAV data chunk is empty")
    check(riff((b"fmt ", bytes(8))), "a malformed WAV fmt chunk of 8 bytes")
    check(riff(*[(b"junk", b"")] * 300), "too many WAV chunks before the data chunk")


def test_float_samples_that_are_not_numbers(speech, encode) -> None:
    x = speech("battery").copy()
    x[1000] = np.nan
    check(encode(x, 16000, "WAV", "FLOAT"), "the samples are not all finite numbers (NaN or infinity)", header=False)
    x[1000] = np.inf
    check(encode(x, 16000, "WAV", "DOUBLE"), "not all finite", header=False)


# FLAC (STREAMINFO's 8 bytes at 18: 20 bits rate, 3 channels - 1, 5 bits per sample - 1, 36 total samples)

def with_streaminfo(data: bytes, rate: int | None = None, total: int | None = None) -> bytes:
    bits = int.from_bytes(data[18:26], "big")
    if rate is not None:
        bits = bits & ((1 << 44) - 1) | rate << 44
    if total is not None:
        bits = bits & ~((1 << 36) - 1) | total
    return data[:18] + bits.to_bytes(8, "big") + data[26:]


def test_flac_cut_short_or_claiming_what_it_does_not_hold(speech, encode) -> None:
    data = encode(speech("capital"), 16000, "FLAC", "PCM_16")
    check(data[:len(data) // 2], "a corrupt or truncated FLAC file", header=False)
    check(data[:30], "truncated: a FLAC metadata block claims 34 bytes, 22 were sent")
    check(with_streaminfo(data, rate=0), "the header says a sample rate of zero")
    check(with_streaminfo(data, total=TEN_HOURS * 16000), "the header claims 10:00:00 of audio, more than the 600 s",
          max_seconds=600)
    # libsndfile fails at the end of the audio it has rather than end it
    check(with_streaminfo(data, total=TEN_HOURS * 16000), "a corrupt or truncated FLAC file", header=False)
    check(with_streaminfo(data, total=0), "a FLAC stream that does not say its length")


# OGG: the first page's packet is the codec's header; the last page carries the end-of-stream flag (bit 2 of
# byte 5) and the length (the granule position, bytes 6 to 14)

def first_packet(data: bytes) -> int:
    return 27 + data[26]


def edited(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new):]


def test_ogg_cut_short_or_not_ended(speech, encode) -> None:
    for subtype in ("VORBIS", "OPUS"):
        data = encode(speech("capital"), 16000, "OGG", subtype)
        check(data[:len(data) // 2], "truncated: an Ogg page claims")
        check(data[:20], "truncated: an Ogg page's header claims 27 bytes, 20 were sent")
        last = data.rfind(b"OggS")
        not_ended = edited(data, last + 5, bytes([data[last + 5] & ~4]))
        check(not_ended, "the OGG stream ends without its end-of-stream page")


def test_ogg_headers_with_no_channels_or_rate_or_another_codec(speech, encode) -> None:
    opus = encode(speech("capital"), 16000, "OGG", "OPUS")
    vorbis = encode(speech("capital"), 16000, "OGG", "VORBIS")
    check(edited(opus, first_packet(opus) + 9, b"\x00"), "the header says zero channels")
    check(edited(vorbis, first_packet(vorbis) + 11, b"\x00"), "the header says zero channels")
    check(edited(vorbis, first_packet(vorbis) + 12, bytes(4)), "the header says a sample rate of zero")
    check(edited(opus, first_packet(opus), b"Speex   "), "OGG with Speex is not supported")
    check(edited(opus, first_packet(opus), b"\x7fFLAC"), "OGG with FLAC is not supported")
    check(edited(opus, first_packet(opus), b"\x80theora"), "OGG with Theora video is not supported")


def test_ogg_whose_last_page_claims_hours(speech, encode) -> None:
    data = encode(speech("capital"), 16000, "OGG", "VORBIS")
    hours = edited(data, data.rfind(b"OggS") + 6, struct.pack("<Q", TEN_HOURS * 16000))
    check(hours, "the header claims 10:00:00 of audio, more than the 600 s allowed", max_seconds=600)
    check(hours, "a malformed OGG file: its header says 10:00:00 of audio, its stream 1.5 s")


# MP3

def test_mp3_cut_short_or_claiming_hours(speech, encode) -> None:
    data = encode(speech("jfk"), 16000, "MP3", "MPEG_LAYER_III")
    check(data[:len(data) // 2], "truncated: the header claims 176000 frames (11.0 s), the file holds 88175",
          header=False)
    check(data[:100], "a malformed or truncated MP3 file")
    tag = data.find(b"Info") if b"Info" in data[:200] else data.find(b"Xing")
    frames = TEN_HOURS * 16000 // 576 + 4           # of 576 samples, less four for the codec's delays
    hours = edited(data, tag + 4, struct.pack(">II", 1, frames))
    check(hours, "the header claims 10:00:00 of audio, more than the 600 s allowed", max_seconds=600)
    check(hours, "truncated: the header claims 576001775 frames (36000.1 s), the file holds 176879", header=False)


def test_an_id3_tag_cut_short_or_leading_nothing(speech_bytes) -> None:
    check(speech_bytes("jfk.mp3")[:40], "truncated: its ID3 tag claims")
    check(b"ID3\x04\x00\x00\x00\x00\x00\x0a" + bytes(10) + b"not audio" * 10,
          "an ID3 tag with neither MP3 nor FLAC audio after it")


def test_the_limit_also_stops_the_decoding_itself(speech_bytes, monkeypatch) -> None:
    """A header that says nothing of its length (none of the formats read has one now that FLAC without a
    length is refused, but libsndfile's counts are its own) is stopped at max_seconds while decoding, a
    block at a time."""
    real = clip._open
    monkeypatch.setattr(clip, "_open", lambda data, max_seconds: real(data, None))
    e = refused(speech_bytes("jfk.wav"), max_seconds=1)
    assert e.reason == "the file holds more than the 1 s of audio allowed"


def test_max_seconds_must_be_positive(speech_bytes) -> None:
    with pytest.raises(ValueError, match="max_seconds must be positive"):
        decode(speech_bytes("jfk.wav"), max_seconds=0)
