"""Transcriptions through the engine (LLMEngine with a tiny random Whisper, as the daemon builds it): the
greedy transcript equals transformers' on the same features (the golden), windows batch with each other
and give what each gives alone, long audio is read window by window, aborts give the pages back, and what
cannot be transcribed is refused naming the field."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from helpers.engines import backed_engine
from nvllm.config import Settings
from nvllm.engine.llm_engine import LLMEngine
from nvllm.engine.outputs import RequestOutput
from nvllm.sampling_params import InvalidParameter, SamplingParams
from nvllm.transcription_params import TranscriptionParams

SPEECH = Path(__file__).resolve().parents[2] / "data" / "speech"
GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "tiny_whisper_transcripts.json"   # transformers' greedy


def engine_for(path: Path, seats: int = 4) -> LLMEngine:
    s = Settings()
    s.model.path = str(path)
    s.model.threads = 1
    s.scheduler.max_num_seqs = seats
    return backed_engine(s)


def run(engine: LLMEngine, requests: dict[str, tuple[bytes, TranscriptionParams]]) -> dict[str, list[RequestOutput]]:
    outs: dict[str, list[RequestOutput]] = {rid: [] for rid in requests}
    for rid, (data, params) in requests.items():
        engine.add_request(rid, {"audio": data}, params)
    for _ in range(20000):
        for out in engine.step():
            outs[out.request_id].append(out)
        if not engine.has_unfinished():
            return outs
    raise AssertionError("the transcriptions did not finish")


def tokens_of(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.token_ids]


def wav(samples: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.fixture(scope="module")
def english(tiny_whispers: dict[str, Path]) -> LLMEngine:
    return engine_for(tiny_whispers["tiny-whisper"])


@pytest.fixture(scope="module")
def jfk() -> bytes:
    return (SPEECH / "jfk.wav").read_bytes()


def test_the_greedy_transcript_is_transformers_token_for_token(english: LLMEngine, jfk: bytes) -> None:
    golden = json.loads(GOLDEN.read_text())["tiny-whisper"]
    for clip, want in golden.items():
        outs = run(english, {clip: ((SPEECH / f"{clip}.wav").read_bytes(), TranscriptionParams(temperature=(0.0,)))})
        final = outs[clip][-1]
        assert final.finished and final.finish_reason == "stop" and final.error is None
        assert tokens_of(outs[clip]) == want["tokens"], clip
        assert final.language == "en"
    assert final.audio_seconds == pytest.approx(len(sf.read(SPEECH / f"{clip}.wav")[0]) / 16000)


def test_a_multilingual_model_is_given_the_language_or_detects_it(tiny_whispers: dict[str, Path], jfk: bytes) -> None:
    multi = engine_for(tiny_whispers["tiny-whisper-multi"])
    want = json.loads(GOLDEN.read_text())["tiny-whisper-multi"]["jfk"]
    outs = run(multi, {"en": (jfk, TranscriptionParams(language="en", temperature=(0.0,)))})["en"]
    assert tokens_of(outs) == want["tokens"] and outs[-1].language == "en"
    detected = run(multi, {"any": (jfk, TranscriptionParams(temperature=(0.0,)))})["any"][-1]
    assert detected.finished and detected.language is not None and len(detected.language) >= 2
    with pytest.raises(InvalidParameter) as e:
        multi.add_request("x", {"audio": jfk}, TranscriptionParams(language="xx"))
    assert e.value.field == "language"


def test_transcriptions_batch_and_each_gives_what_it_gives_alone(english: LLMEngine, jfk: bytes) -> None:
    clips = {"jfk": jfk, **{p.stem: p.read_bytes() for p in sorted(SPEECH.glob("*.wav")) if p.stem != "jfk"}}
    params = TranscriptionParams(temperature=(0.0,))
    alone = {name: tokens_of(run(english, {name: (data, params)})[name]) for name, data in clips.items()}
    steps = english.num_steps
    together = run(english, {name: (data, params) for name, data in clips.items()})
    assert {name: tokens_of(o) for name, o in together.items()} == alone
    assert english.num_steps - steps < sum(len(t) for t in alone.values())   # rows shared steps


def test_long_audio_is_read_in_windows_whose_segments_follow_each_other(english: LLMEngine, jfk: bytes) -> None:
    samples, rate = sf.read(io.BytesIO(jfk), dtype="float32")
    long = wav(np.concatenate([samples] * 4))                  # 44 s: two windows at least
    outs = run(english, {"long": (long, TranscriptionParams(temperature=(0.0,), timestamps=True))})["long"]
    segments = [s for o in outs for s in (o.segments or [])]
    assert english.transcriber is not None and english.transcriber.num_windows >= 2
    assert segments and all(a.end <= b.start + 1e-6 or a.seek < b.seek for a, b in zip(segments, segments[1:]))
    assert all(0 <= s.start <= s.end <= 44.0 + 30 for s in segments)
    assert [s.id for s in segments] == list(range(len(segments)))


def test_fallback_decodes_an_unsure_window_again_hotter(english: LLMEngine, jfk: bytes) -> None:
    # A random model is unsure of everything: with a threshold no window meets, every temperature is tried
    # and the last one's decoding is kept.
    params = TranscriptionParams(logprob_threshold=0.0, no_speech_threshold=None, seed=7)
    outs = run(english, {"hot": (jfk, params)})["hot"]
    segments = [s for o in outs for s in (o.segments or [])]
    assert segments and {s.temperature for s in segments} == {1.0}
    again = run(english, {"again": (jfk, params)})["again"]
    assert tokens_of(again) == tokens_of(outs)     # the seed makes the draws the same


def test_an_aborted_transcription_gives_its_pages_back(english: LLMEngine, jfk: bytes) -> None:
    english.add_request("gone", {"audio": jfk}, TranscriptionParams())
    english.step()
    english.step()
    assert english.abort_request("gone")
    outs = english.step()
    assert any(o.request_id == "gone" and o.finish_reason == "abort" for o in outs)
    assert not english.has_unfinished()
    assert english.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("data, field", [(b"", "file"), (b"not audio at all, just some bytes" * 10, "file"),
                                         (b"RIFF\x00\x00\x00\x00WAVEfmt ", "file")])
def test_what_is_not_audio_is_refused_naming_file(english: LLMEngine, data: bytes, field: str) -> None:
    with pytest.raises(InvalidParameter) as e:
        english.add_request("bad", {"audio": data}, TranscriptionParams())
    assert e.value.field == field and str(e.value).startswith("file")


def test_a_chat_to_a_speech_model_and_speech_to_a_chat_model_are_refused_naming_model(
        english: LLMEngine, tiny_models: dict[str, Path], jfk: bytes) -> None:
    with pytest.raises(InvalidParameter) as e:
        english.add_request("chat", "Hello", SamplingParams(max_tokens=4))
    assert e.value.field == "model" and "transcribes speech" in str(e.value)
    chat = engine_for(tiny_models["tiny-llama"])
    with pytest.raises(InvalidParameter) as e:
        chat.add_request("speech", {"audio": jfk}, TranscriptionParams())
    assert e.value.field == "model" and "a transcript" in str(e.value)


def test_an_english_only_model_refuses_translation_and_other_languages(english: LLMEngine, jfk: bytes) -> None:
    for params, field in ((TranscriptionParams(task="translate"), "model"), (TranscriptionParams(language="de"),
                                                                              "language")):
        with pytest.raises(InvalidParameter) as e:
            english.add_request("x", {"audio": jfk}, params)
        assert e.value.field == field
