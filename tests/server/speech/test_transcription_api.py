"""OpenAI's /v1/audio/transcriptions and /translations in process, driven by the official client, over a stand-in
speech model (helpers/speech_stub.py): each response format, the stream's events, the form's fields mapped onto
TranscriptionParams, and every refusal with its status and field (413 naming file past the upload limit)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest

from helpers.speech_stub import CHAT, HEARD, SECONDS, SPEECH, SpeechStub, serve_speech
from nvllm import LLM
from nvllm.engine.llm_engine import LLMEngine
from nvllm.server.state import DaemonState

WAV = b"RIFF" + bytes(60)     # the stub reads anything that starts so as audio


@pytest.fixture(scope="module")
def engine(tiny_models: dict[str, Path]) -> LLMEngine:
    return LLM(tiny_models["tiny-llama"], num_blocks=64, max_num_seqs=4).engine


def client_of(http: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://nvllm/v1", api_key="unused", http_client=http, max_retries=0)


def run(engine: LLMEngine | None, body: Any, **kw: Any) -> Any:
    return serve_speech(engine, body, **kw)


def test_every_response_format_through_the_official_client(engine: LLMEngine) -> None:
    async def body(http, stub, state: DaemonState, speech: SpeechStub) -> dict[str, Any]:
        c = client_of(http)
        out: dict[str, Any] = {}
        for fmt in ("json", "text", "srt", "vtt", "verbose_json"):
            out[fmt] = await c.audio.transcriptions.create(file=("clip.wav", WAV), model=SPEECH, response_format=fmt)
        out["default"] = await c.audio.transcriptions.create(file=("clip.wav", WAV), model=SPEECH)
        out["asked"] = [p.timestamps for _, p in speech.asked]
        return out
    out = run(engine, body)
    assert out["json"].text == HEARD and out["json"].usage.seconds == SECONDS
    assert out["default"].text == HEARD
    assert out["text"] == HEARD + "\n"
    assert out["srt"].startswith("1\n00:00:00,000 --> 00:00:01,250\nHello there.\n\n2\n")
    assert out["vtt"].startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.250\nHello there.")
    v = out["verbose_json"]
    assert (v.language, v.duration, v.text, len(v.segments)) == ("english", SECONDS, HEARD, 2)
    # Timestamps are decoded where the format has times (srt, vtt, verbose_json) and not otherwise.
    assert out["asked"] == [False, False, True, True, True, False]


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")     # the client's translations
def test_the_forms_fields_reach_the_request(engine: LLMEngine) -> None:
    async def body(http, stub, state, speech: SpeechStub) -> Any:
        c = client_of(http)
        await c.audio.transcriptions.create(file=("a.wav", WAV), model=SPEECH, language="de", prompt="Zeppelin",
                                            temperature=0.4, response_format="verbose_json",
                                            timestamp_granularities=["segment"], extra_body={"seed": 7})
        await c.audio.transcriptions.create(file=("a.wav", WAV), model=SPEECH, temperature=0)
        t = await c.audio.translations.create(file=("a.wav", WAV), model=SPEECH, prompt="p", response_format="json")
        v = await c.audio.translations.create(file=("a.wav", WAV), model=SPEECH, response_format="verbose_json")
        return speech.asked, t, v
    asked, t, v = run(engine, body)
    first, greedy, translated = asked[0][1], asked[1][1], asked[2][1]
    assert (first.task, first.language, first.prompt, first.temperature, first.timestamps, first.seed) == \
        ("transcribe", "de", "Zeppelin", (0.4,), True, 7)
    assert greedy.temperature == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)   # 0: Whisper's fallback from 0, as OpenAI's
    assert (translated.task, translated.prompt) == ("translate", "p")
    assert t.text == HEARD and v.language == "english" and v.task == "translate"


def test_no_model_named_goes_to_the_speech_model(engine: LLMEngine) -> None:
    async def body(http, stub, state, speech) -> Any:
        r = await http.post("/v1/audio/transcriptions", files={"file": ("a.wav", WAV)})
        return r.status_code, r.json(), len(speech.asked)
    assert run(engine, body) == (200, {"text": HEARD, "usage": {"type": "duration", "seconds": SECONDS}}, 1)


def test_the_stream_sends_delta_events_then_done(engine: LLMEngine) -> None:
    async def body(http, stub, state, speech) -> Any:
        events = []
        stream = await client_of(http).audio.transcriptions.create(file=("a.wav", WAV), model=SPEECH, stream=True)
        async for event in stream:
            events.append(event)
        raw = await http.post("/v1/audio/transcriptions", files={"file": ("a.wav", WAV)},
                              data={"stream": "true", "response_format": "text"})
        return events, raw
    events, raw = run(engine, body)
    assert [e.type for e in events] == ["transcript.text.delta", "transcript.text.delta", "transcript.text.done"]
    assert "".join(e.delta for e in events[:-1]) == events[-1].text == HEARD
    assert events[-1].usage.output_tokens == 8
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert "event: transcript.text.done" in raw.text and "[DONE]" not in raw.text


def error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    return r.json()["error"]


REFUSED = [   # (form fields, files, status, param, in the message)
    ({"response_format": "verbose_json", "timestamp_granularities[]": "word"}, None, 400, "timestamp_granularities",
     "word timestamps are not supported"),
    ({"timestamp_granularities[]": "segment"}, None, 400, "timestamp_granularities", "verbose_json"),
    ({"response_format": "diarized_json"}, None, 400, "response_format", "diarization"),
    ({"response_format": "mp4"}, None, 400, "response_format", "json, text, srt, vtt, verbose_json"),
    ({"include[]": "logprobs"}, None, 400, "include", "not supported"),
    ({"chunking_strategy": "server_vad"}, None, 400, "chunking_strategy", "auto"),
    ({"stream": "true", "response_format": "srt"}, None, 400, "stream", "json or text"),
    ({"stream": "maybe"}, None, 400, "stream", "true or false"),
    ({"temperature": "2"}, None, 400, "temperature", "from 0 to 1"),
    ({"temperature": "warm"}, None, 400, "temperature", "a number"),
    ({"language": "english-of-england"}, None, 400, "language", "language code"),
    ({"keep_alive": "soon"}, None, 400, "keep_alive", "duration"),
    ({"priority": "high"}, None, 400, "priority", "integer"),
    ({"seed": "-1"}, None, 400, "seed", "[0, 2**63)"),
    ({"seed": "x"}, None, 400, "seed", "integer"),
    ({"speaker": "me"}, None, 400, "speaker", "unknown parameter"),
    ({}, {"file": ("a.wav", b"")}, 400, "file", "empty"),
    ({}, {"file": ("a.txt", b"hello, not audio")}, 400, "file", "not an audio file"),
    ({}, {"file": (None, "RIFF....")}, 400, "file", "file part"),
    ({"model": "no-such-model"}, None, 404, "model", "does not exist"),
]


@pytest.mark.parametrize(("fields", "files", "status", "param", "says"), REFUSED,
                         ids=[f"{c[3]}-{c[2]}-{i}" for i, c in enumerate(REFUSED)])
def test_a_bad_form_is_refused_naming_its_field(engine: LLMEngine, fields: dict[str, str], files: Any, status: int,
                                                param: str, says: str) -> None:
    async def body(http, stub, state, speech) -> httpx.Response:
        sent = {"file": ("a.wav", WAV)} if files is None else files
        return await http.post("/v1/audio/transcriptions", data=fields, files=sent)
    err = error(run(engine, body), status)
    assert err["param"] == param and says in err["message"], err


def test_translations_take_only_openais_translation_fields(engine: LLMEngine) -> None:
    async def body(http, stub, state, speech) -> list[httpx.Response]:
        return [await http.post("/v1/audio/translations", data={k: v}, files={"file": ("a.wav", WAV)})
                for k, v in (("language", "de"), ("stream", "true"))]
    for r, param in zip(run(engine, body), ("language", "stream")):
        assert error(r, 400)["param"] == param


def test_a_chat_model_asked_to_transcribe_is_refused_naming_model(engine: LLMEngine) -> None:
    async def body(http, stub, state, speech) -> Any:
        with pytest.raises(openai.BadRequestError) as e:
            await client_of(http).audio.transcriptions.create(file=("a.wav", WAV), model=CHAT)
        return e.value
    e = run(engine, body)
    assert e.status_code == 400 and e.body["param"] == "model", e.body


def test_no_speech_model_served_is_refused_naming_model(engine: LLMEngine) -> None:
    async def body(http, stub, state, speech) -> httpx.Response:
        return await http.post("/v1/audio/transcriptions", files={"file": ("a.wav", WAV)})
    err = error(run(engine, body, speech=False), 400)
    assert err["param"] == "model" and "no speech model is served" in err["message"]


def test_an_upload_past_the_limit_is_413_naming_file_and_not_read_whole(engine: LLMEngine) -> None:
    limit = 4096
    sent: list[int] = []

    async def chunks():
        yield b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF"
        for _ in range(1000):        # 64 MiB offered; the server stops after the limit and the form's slack
            sent.append(1)
            yield bytes(64 << 10)

    async def body(http, stub, state, speech) -> list[httpx.Response]:
        whole = await http.post("/v1/audio/transcriptions", files={"file": ("a.wav", WAV + bytes(limit))})
        declared = await http.post("/v1/audio/transcriptions", files={"file": ("a.wav", bytes(1 << 20))})
        streamed = await http.post("/v1/audio/transcriptions", content=chunks(),
                                   headers={"content-type": "multipart/form-data; boundary=b"})
        return [whole, declared, streamed]
    for r in run(engine, body, max_audio_bytes=limit):
        err = error(r, 413)
        assert err["param"] == "file" and "server.max_audio_bytes" in err["message"]
    assert len(sent) < 10


def test_a_body_that_is_not_a_form_is_refused_naming_file(engine: LLMEngine) -> None:
    async def body(http, stub, state, speech) -> list[httpx.Response]:
        return [await http.post("/v1/audio/transcriptions", json={"file": "x"}),
                await http.post("/v1/audio/transcriptions", content=b"--zz\r\nbroken",
                                headers={"content-type": "multipart/form-data; boundary=zz"}),
                await http.post("/v1/audio/transcriptions", files=[("file", ("a.wav", WAV)), ("file", ("b", WAV))])]
    for r in run(engine, body):
        assert error(r, 400)["param"] == "file"


def test_refusals_are_counted_and_the_stream_is_released(engine: LLMEngine) -> None:
    async def body(http, stub, state: DaemonState, speech: SpeechStub) -> Any:
        await http.post("/v1/audio/transcriptions", files={"file": ("a.txt", b"text")})
        await http.post("/v1/audio/transcriptions", files={"file": ("a.wav", WAV)}, data={"response_format": "x"})
        await http.post("/v1/audio/transcriptions", files={"file": ("a.wav", WAV)})
        return state.streams_by_client, io.StringIO(json.dumps(state.model_status())).getvalue()
    streams, status = run(engine, body)
    assert streams == {}
    assert '"whisper-stub"' in status
