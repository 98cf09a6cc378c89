"""A transcription's answer in OpenAI's shapes (server/http/transcription_response.py), from made segments: the
five response formats, the stream's events, each held to the official client's own models (openai==3.51.0)."""

from __future__ import annotations

import json

import pytest
from openai.types.audio import (
    Transcription,
    TranscriptionTextDeltaEvent,
    TranscriptionTextDoneEvent,
    TranscriptionVerbose,
    Translation,
    TranslationVerbose,
)

from helpers.speech_stub import HEARD, SECONDS, WINDOWS, segments
from nvllm.engine.outputs import RequestOutput, Segment
from nvllm.server.http.errors import ApiError
from nvllm.server.http.transcription_reader import TranscriptionAsk
from nvllm.server.http.transcription_response import (
    LANGUAGE_NAMES,
    TranscriptAnswer,
    formatted,
    language_name,
    segment_dict,
    srt,
    vtt,
)
from nvllm.server.transcribing import Transcript, TranscriptionFailed
from nvllm.transcription_params import TranscriptionParams


def transcript(timestamps: bool = True) -> Transcript:
    t = Transcript()
    marks = segments(timestamps)
    t.add(RequestOutput("r", WINDOWS[0], [1], None, False, None, None, 4, 1, 0, segments=[marks[0]]))
    t.add(RequestOutput("r", WINDOWS[1], [2], None, True, "stop", None, 4, 8, 0, segments=[marks[1]],
                        language="en", audio_seconds=SECONDS))
    return t


def body(response) -> dict:
    return json.loads(bytes(response.body))


def test_the_text_drops_whispers_leading_space_and_the_deltas_add_up_to_it() -> None:
    t = transcript()
    assert t.text == HEARD and t.heard == HEARD
    assert (t.language, t.seconds, t.prompt_tokens, t.completion_tokens) == ("en", SECONDS, 4, 8)
    assert [s.text for s in t.segments] == list(WINDOWS)


def test_json_is_openais_transcription_with_the_duration_as_usage() -> None:
    b = body(formatted(transcript(), "json"))
    assert b == {"text": HEARD, "usage": {"type": "duration", "seconds": SECONDS}}
    parsed = Transcription.model_validate(b)
    assert parsed.text == HEARD and parsed.usage is not None and parsed.usage.type == "duration"
    assert body(formatted(transcript(), "json", "translate")) == {"text": HEARD}
    Translation.model_validate(body(formatted(transcript(), "json", "translate")))


def test_text_is_the_transcript_and_a_newline() -> None:
    r = formatted(transcript(), "text")
    assert bytes(r.body).decode() == HEARD + "\n"
    assert r.media_type == "text/plain"


def test_verbose_json_holds_every_segment_and_names_the_language_as_openai_does() -> None:
    b = body(formatted(transcript(), "verbose_json"))
    v = TranscriptionVerbose.model_validate(b)
    assert (v.language, v.duration, v.text) == ("english", SECONDS, HEARD)
    assert b["task"] == "transcribe"
    assert v.segments is not None and [s.text for s in v.segments] == list(WINDOWS)
    assert [(s.start, s.end) for s in v.segments] == [(0.0, 1.25), (1.25, SECONDS)]
    assert v.segments[1].tokens == [101, 201] and v.segments[1].avg_logprob == -0.25
    tr = body(formatted(transcript(), "verbose_json", "translate"))
    assert TranslationVerbose.model_validate(tr).language == "english" and tr["task"] == "translate"


def test_srt_and_vtt_are_the_segments_as_subtitles() -> None:
    marks = [Segment(0, 0, 0.0, 1.2345, " Hello there.", [], 0.0, -0.1, 1.0, 0.0),
             Segment(1, 3000, 3661.5, 3725.0009, " And then.", [], 0.0, -0.1, 1.0, 0.0)]
    assert srt(marks) == ("1\n00:00:00,000 --> 00:00:01,234\nHello there.\n\n"
                          "2\n01:01:01,500 --> 01:02:05,001\nAnd then.\n\n")
    assert vtt(marks) == ("WEBVTT\n\n00:00:00.000 --> 00:00:01.234\nHello there.\n\n"
                          "01:01:01.500 --> 01:02:05.001\nAnd then.\n\n")
    assert bytes(formatted(transcript(), "srt").body).decode().startswith("1\n00:00:00,000 --> 00:00:01,250\nHello")
    r = formatted(transcript(), "vtt")
    assert r.media_type == "text/vtt" and bytes(r.body).decode().startswith("WEBVTT\n\n")


def test_a_segment_never_sends_what_json_cannot_hold() -> None:
    s = Segment(0, 0, 0.0, 1.0, " x", [1], 0.0, float("-inf"), float("nan"), 0.5)
    d = segment_dict(s)
    assert d["avg_logprob"] == -9999.0 and d["compression_ratio"] == 0.0
    json.dumps(d, allow_nan=False)


def test_languages_by_their_english_names() -> None:
    assert (language_name("en"), language_name("de"), language_name("yue")) == ("english", "german", "cantonese")
    assert language_name("xx") == "xx" and language_name(None) == ""
    assert len(LANGUAGE_NAMES) == 100 and LANGUAGE_NAMES["ht"] == "haitian creole"


def _ask(fmt: str = "json") -> TranscriptionAsk:
    return TranscriptionAsk(b"RIFF", TranscriptionParams(), None, fmt, stream=True)


def test_the_stream_is_openais_delta_and_done_events() -> None:
    a = TranscriptAnswer(_ask(), "rid")
    marks = segments(False)
    first = a.events(0, RequestOutput("r", WINDOWS[0], [1], None, False, None, None, 4, 1, 0, segments=[marks[0]]))
    empty = a.events(0, RequestOutput("r", "", [], None, False, None, None, 4, 1, 0))
    last = a.events(0, RequestOutput("r", WINDOWS[1], [2], None, True, "stop", None, 4, 8, 0, segments=[marks[1]],
                                     language="en", audio_seconds=SECONDS))
    done = a.closing()
    assert empty == [] and len(first) == len(last) == len(done) == 1
    assert [e["event"] for e in first + last + done] == ["transcript.text.delta"] * 2 + ["transcript.text.done"]
    deltas = [TranscriptionTextDeltaEvent.model_validate(json.loads(e["data"])) for e in first + last]
    assert "".join(d.delta for d in deltas) == HEARD
    end = TranscriptionTextDoneEvent.model_validate(json.loads(done[0]["data"]))
    assert end.text == HEARD and end.usage is not None
    assert (end.usage.input_tokens, end.usage.output_tokens, end.usage.total_tokens) == (4, 8, 12)
    assert a.token_counts() == (4, 8)
    failed = a.failed(ApiError(500, "boom", code="engine_error"))
    assert failed["event"] == "error" and json.loads(failed["data"])["error"]["message"] == "boom"


def test_a_failed_or_aborted_output_fails_the_transcript() -> None:
    with pytest.raises(TranscriptionFailed) as e:
        Transcript().add(RequestOutput("r", "", [], None, True, "abort", None, 4, 0, 0))
    assert e.value.aborted
    with pytest.raises(TranscriptionFailed) as e:
        Transcript().add(RequestOutput("r", "", [], None, True, "stop", None, 4, 0, 0, error="bad step"))
    assert not e.value.aborted and "bad step" in str(e.value)
    with pytest.raises(ApiError) as err:
        TranscriptAnswer(_ask(), "rid").add(0, RequestOutput("r", "", [], None, True, "abort", None, 4, 0, 0))
    assert err.value.status == 503
