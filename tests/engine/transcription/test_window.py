"""A decoded window's segments, seek and fallback (engine/transcription/window.py), as openai-whisper's
transcribe() reads one window."""

from __future__ import annotations

from nvllm.engine.transcription.tokens import WhisperTokens
from nvllm.engine.transcription.window import (
    Decoded,
    compression_ratio,
    is_silence,
    needs_fallback,
    segments_of,
)
from nvllm.transcription_params import TranscriptionParams

EOT, BEGIN = 100, 104
T = WhisperTokens(eot=EOT, sot=101, sot_prev=102, no_timestamps=103, timestamp_begin=BEGIN, no_speech=None,
                  transcribe=None, translate=None, sot_lm=None, languages={}, suppress=(), begin_suppress=())


def words(ids: list[int]) -> str:
    return "".join(f" w{i}" for i in ids)


def test_pairs_of_timestamps_cut_segments_and_the_reading_resumes_at_the_last_one() -> None:
    # <|0.00|> a b <|1.00|><|1.00|> c <|2.50|><|2.50|> d (cut by the window's end)
    toks = [BEGIN, 1, 2, BEGIN + 50, BEGIN + 50, 3, BEGIN + 125, BEGIN + 125, 4]
    segs, moved = segments_of(Decoded(0.0, toks, -1.0), 1000, 3000, T, words, 7, 1.1)
    assert [(s.id, s.start, s.end, s.text) for s in segs] == [(7, 10.0, 11.0, " w1 w2"), (8, 11.0, 12.5, " w3")]
    assert moved == 250    # <|2.50|> is frame 250 of the window: d is read again in the next
    assert all(s.seek == 1000 and s.temperature == 0.0 for s in segs)


def test_a_window_ending_on_a_single_timestamp_is_read_whole() -> None:
    toks = [BEGIN, 1, 2, BEGIN + 50, BEGIN + 50, 3, BEGIN + 90]
    segs, moved = segments_of(Decoded(0.0, toks), 0, 1100, T, words, 0, 1.0)
    assert [(s.start, s.end, s.text) for s in segs] == [(0.0, 1.0, " w1 w2"), (1.0, 1.8, " w3")]
    assert moved == 1100


def test_without_timestamps_the_window_is_one_segment_of_its_length() -> None:
    segs, moved = segments_of(Decoded(0.2, [1, 2, 3]), 3000, 1100, T, words, 0, 1.0)
    assert [(s.start, s.end, s.text, s.temperature) for s in segs] == [(30.0, 41.0, " w1 w2 w3", 0.2)]
    assert moved == 1100


def test_fallback_on_a_loop_or_an_unsure_window_but_not_on_silence() -> None:
    p = TranscriptionParams()
    sure = Decoded(0.0, [1, 2, 3], sum_logprob=-0.4)
    assert not needs_fallback(sure, "a plain sentence", p)
    assert needs_fallback(sure, "la " * 100, p) and compression_ratio("la " * 100) > 2.4
    unsure = Decoded(0.0, [1, 2, 3], sum_logprob=-8.0)       # average -2 < -1
    assert needs_fallback(unsure, "a plain sentence", p)
    silent = Decoded(0.0, [1, 2, 3], sum_logprob=-8.0, no_speech_prob=0.9)
    assert not needs_fallback(silent, "a plain sentence", p) and is_silence(silent, p)
    assert not is_silence(Decoded(0.0, [1], sum_logprob=-0.1, no_speech_prob=0.9), p)   # sure of its words
    off = TranscriptionParams(compression_ratio_threshold=None, logprob_threshold=None)
    assert not needs_fallback(unsure, "la " * 100, off)
