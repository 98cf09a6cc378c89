"""Every format and rate read decodes to 16 kHz mono float32: each encoding of a spoken clip against the 16-bit
original, as close as its codec allows (lossless ones exactly), resampled ones against soxr's own one-shot
resampling, and probe's report of the header."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import soxr

from nvllm.audio.clip import SAMPLE_RATE, AudioInfo, decode, probe
from nvllm.audio.features import log_mel


def snr_db(got: np.ndarray, want: np.ndarray) -> float:
    """The signal-to-error ratio of `got` against `want`, in dB, sample by sample (no realignment: the codecs'
    delays are undone by their decoders)."""
    error = got.astype(np.float64) - want
    return float(10 * np.log10(np.sum(np.square(want, dtype=np.float64)) / max(np.sum(np.square(error)), 1e-30)))


def check_shape(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.ndim == 1
    assert len(got) == len(want)
    assert np.abs(got).max() <= 1.0


# (format, subtype) of a lossless encoding of 16-bit samples: decoded exactly
LOSSLESS = [("WAV", "PCM_24"), ("WAV", "PCM_32"), ("WAV", "FLOAT"), ("WAV", "DOUBLE"), ("WAVEX", "PCM_16"),
            ("FLAC", "PCM_16"), ("FLAC", "PCM_24")]


@pytest.mark.parametrize("format, subtype", LOSSLESS)
def test_a_lossless_encoding_decodes_to_the_same_samples(speech, encode, format, subtype) -> None:
    x = speech("capital")
    got = decode(encode(x, 16000, format, subtype))
    check_shape(got, x)
    assert np.array_equal(got, x)


def test_a_16_bit_wav_is_its_samples_over_32768(speech, speech_bytes) -> None:
    data = speech_bytes("jfk.wav")
    assert probe(data) == AudioInfo("WAV", "PCM_16", 16000, 1, 176000)
    assert probe(data).seconds == 11.0
    assert np.array_equal(decode(data), speech("jfk"))


def test_8_bit_wav_is_within_one_step_of_8_bits(speech, encode) -> None:
    x = speech("capital")
    data = encode(x, 16000, "WAV", "PCM_U8")
    assert probe(data).subtype == "PCM_U8"
    got = decode(data)
    check_shape(got, x)
    assert np.abs(got - x).max() <= 1 / 128


@pytest.mark.parametrize("subtype", ["ULAW", "ALAW"])
def test_companded_wav_is_within_its_8_bit_logarithmic_steps(speech, encode, subtype) -> None:
    x = speech("capital")
    got = decode(encode(x, 16000, "WAV", subtype))
    check_shape(got, x)
    assert snr_db(got, x) > 30      # G.711 keeps ~38 dB on speech


# (format, subtype, rate): lossy codecs, aligned with the original (their decoders drop the encoder's delay), and
# their log-mel features close to the original's on average: what the model sees
LOSSY = [("OGG", "VORBIS", 16000), ("OGG", "OPUS", 16000), ("MP3", "MPEG_LAYER_III", 16000),
         ("MP3", "MPEG_LAYER_III", 44100), ("OGG", "OPUS", 48000)]


@pytest.mark.parametrize("format, subtype, rate", LOSSY)
def test_a_lossy_encoding_decodes_to_the_speech_within_its_codecs_error(speech, encode, format, subtype,
                                                                           rate) -> None:
    x = speech("capital")
    source = x if rate == 16000 else soxr.resample(x, 16000, rate)
    data = encode(source, rate, format, subtype)
    assert (probe(data).format, probe(data).subtype, probe(data).rate) == (format, subtype, rate)
    got = decode(data)
    check_shape(got, x)
    assert snr_db(got, x) > 12      # measured 17 to 33 dB
    assert np.abs(log_mel(got) - log_mel(x)).mean() < 0.1   # measured 0.01 to 0.05


def test_the_real_world_mp3_decodes_aligned_with_its_wav(speech, speech_bytes) -> None:
    """whisper.cpp's jfk.mp3: an ID3 tag, a LAME Info tag, 16 kHz mono."""
    data = speech_bytes("jfk.mp3")
    assert probe(data) == AudioInfo("MP3", "MPEG_LAYER_III", 16000, 1, 176000)
    got, x = decode(data), speech("jfk")
    check_shape(got, x)
    assert snr_db(got, x) > 12


@pytest.mark.parametrize("rate, subtype", [(44100, "FLOAT"), (8000, "PCM_16"), (22050, "PCM_16"), (48000, "PCM_24")])
def test_another_rate_is_resampled_to_16_khz_as_soxr_does_it_in_one_go(speech, encode, rate, subtype) -> None:
    """jfk's 11 s at 44.1 kHz are two of the decoder's blocks, resampled as a stream."""
    x = speech("jfk")
    data = encode(soxr.resample(x, 16000, rate), rate, "WAV", subtype)
    at_rate = decode_raw(data)
    got = decode(data)
    assert got.dtype == np.float32 and got.ndim == 1
    want = soxr.resample(at_rate, rate, SAMPLE_RATE, quality="HQ")
    np.testing.assert_array_equal(got, np.clip(want, -1, 1))
    assert abs(len(got) - len(x)) <= 1
    n = min(len(got), len(x))
    # 8 kHz loses everything above 4 kHz; the others only the resamplers' transition bands
    assert snr_db(got[:n], x[:n]) > (15 if rate == 8000 else 35)


def decode_raw(data: bytes) -> np.ndarray:
    """The file's mono samples at its own rate, by soundfile in one read."""
    import io

    import soundfile as sf
    samples, _ = sf.read(io.BytesIO(data), dtype="float32")
    return samples


def test_channels_are_mixed_down_by_their_mean(speech, encode) -> None:
    x = speech("capital")
    stereo = np.stack([x, x * 0.5], axis=1)
    data = encode(stereo, 16000, "WAV", "FLOAT")
    assert probe(data).channels == 2
    np.testing.assert_allclose(decode(data), x * 0.75, rtol=0, atol=1e-7)
    six = np.stack([x * (i % 2) for i in range(6)], axis=1)      # 5.1: every other channel silent
    np.testing.assert_allclose(decode(encode(six, 16000, "FLAC", "PCM_16")), x / 2, rtol=0, atol=1e-7)


def test_stereo_mp3_at_44_khz_decodes_to_16_khz_mono(speech, encode) -> None:
    x = speech("capital")
    y = soxr.resample(x, 16000, 44100)
    data = encode(np.stack([y, y], axis=1), 44100, "MP3", "MPEG_LAYER_III")
    assert (probe(data).channels, probe(data).rate) == (2, 44100)
    got = decode(data)
    check_shape(got, x)
    assert snr_db(got, x) > 20


def test_float_samples_past_full_scale_are_clipped(speech, encode) -> None:
    x = speech("capital")
    got = decode(encode(x * 4, 16000, "WAV", "FLOAT"))
    assert got.max() == 1.0 and got.min() == -1.0
    np.testing.assert_array_equal(got, np.clip(x * 4, -1, 1))


def test_a_streamed_wav_whose_data_size_is_unknown_reads_to_the_end(speech, speech_bytes) -> None:
    """Writers on a pipe put 0xFFFFFFFF in the data chunk's size: it is read as 'to the end of the file'."""
    data = bytearray(speech_bytes("jfk.wav"))
    at = data.index(b"data")
    data[at + 4:at + 8] = struct.pack("<I", 0xFFFFFFFF)
    assert np.array_equal(decode(bytes(data)), speech("jfk"))


def test_an_id3_tag_before_flac_is_skipped(speech, encode) -> None:
    x = speech("battery")
    tag = b"ID3\x04\x00\x00\x00\x00\x00\x14" + b"\x00" * 20
    assert np.array_equal(decode(tag + encode(x, 16000, "FLAC", "PCM_16")), x)


def test_chunks_before_the_data_and_an_odd_sized_one_are_walked(speech, riff, fmt_chunk) -> None:
    x = speech("battery")
    pcm = (x * 32768).astype("<i2").tobytes()
    data = riff((b"LIST", b"INFOISFT\x05\x00\x00\x00nvllm"), fmt_chunk(), (b"junk", b"\x00" * 3), (b"data", pcm))
    assert np.array_equal(decode(data), x)


def test_max_seconds_lets_a_clip_of_that_length_through(speech, speech_bytes) -> None:
    assert len(decode(speech_bytes("jfk.wav"), max_seconds=11.0)) == 176000
    assert probe(speech_bytes("jfk.mp3"), max_seconds=11.0).frames == 176000
