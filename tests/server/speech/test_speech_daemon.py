"""End-to-end: the real daemon serving a chat model and speech models (tiny random Whisper folders; the real
tiny.en where it is pulled), over HTTP with the official openai client and over gRPC.

Every response format and the stream through the official client, one transcript whatever the format (seeded,
so that a fallback's draws repeat); translations; gRPC Transcribe in one message and in chunks, listed by
reflection; bad audio refused before it is decoded whole, naming file (audio over gRPC), 413 past the upload
limit; a chat model asked to transcribe refused naming model; the voice query over both APIs answered as the
transcript sent as text is; the speech model served as any model (Health and /metrics by name, keep_alive 0
unloads it); no page leaked. On the real tiny.en, the spoken clips heard as they were said.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx2 as httpx
import openai
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from helpers.daemon_util import BASE_CONFIG, DaemonProcess, config_with, health, health_when, pages_all_back
from helpers.speech_files import clip, real_whisper, tiny_whisper, wav, wav_header
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

CHAT, SPEECH, MULTI = "tiny-llama", "tiny-whisper", "tiny-whisper-multi"
VOICE_SEED = 7
MAX_AUDIO = 1 << 20
CONFIG = config_with(BASE_CONFIG, server__speech_model=SPEECH, server__max_audio_bytes=MAX_AUDIO,
                     server__max_audio_seconds=30.0)
GREEDY = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}
SEED = {"seed": 3}


def all_pages_back(address: str) -> None:
    health_when(address, lambda h: all(m.pages_free + m.pages_cached == m.pages_total for m in h.models
                                       if m.state == pb.ModelHealth.STATE_LOADED) and pages_all_back(h),
                "every model's pages free or cached", timeout=30)


@pytest.fixture(scope="module")
def daemon(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("speech"), tiny, CONFIG, http_listen="127.0.0.1:0",
                      extra_args=("--model", str(tiny_whisper(SPEECH)), "--model", str(tiny_whisper(MULTI))))
    yield d
    d.stop()


@pytest.fixture
def client(daemon: DaemonProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=daemon.http_url + "/v1", api_key="unused", max_retries=0, timeout=300) as c:
        yield c


def transcribe(stub: pb_grpc.GeneratorStub, audio: bytes, chunk: int = 0,
               **options: Any) -> list[pb.TranscribeResponse]:
    pieces = ([audio[i:i + chunk] for i in range(0, len(audio), chunk)] if chunk else []) or [audio]
    messages = [pb.TranscribeRequest(audio=pieces[0], **options)] + [pb.TranscribeRequest(audio=p) for p in pieces[1:]]
    return list(stub.Transcribe(iter(messages), timeout=300))


# -- transcription -----------------------------------------------------------------------------------
def test_every_response_format_gives_one_transcript(daemon: DaemonProcess, client: openai.OpenAI) -> None:
    audio = clip("battery")
    got: dict[str, Any] = {fmt: client.audio.transcriptions.create(file=("battery.wav", audio), model=SPEECH,
                                                                   response_format=fmt, extra_body=SEED)
                           for fmt in ("json", "text", "srt", "vtt", "verbose_json")}
    stream: list[Any] = list(client.audio.transcriptions.create(file=("battery.wav", audio), model=SPEECH,
                                                                stream=True, extra_body=SEED))
    default = client.audio.transcriptions.create(file=("battery.wav", audio), model="", extra_body=SEED)
    text = got["json"].text
    assert got["text"] == text + "\n" and default.text == text
    v = got["verbose_json"]
    assert v.language == "english" and abs(v.duration - len(audio[44:]) / 32000) < 0.05 and v.segments
    assert got["json"].usage.seconds == pytest.approx(v.duration)
    assert all(0 <= s.start <= s.end for s in v.segments)      # random weights: its times may pass the audio's end
    assert got["srt"].count(" --> ") == got["vtt"].count(" --> ") == len(v.segments)
    assert got["vtt"].startswith("WEBVTT\n\n")
    assert [e.type for e in stream][-1] == "transcript.text.done"
    assert "".join(e.delta for e in stream[:-1]) == stream[-1].text
    all_pages_back(daemon.address)


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")     # the client's translations
def test_a_multilingual_model_translates_and_an_english_one_is_refused(client: openai.OpenAI) -> None:
    t = client.audio.translations.create(file=("a.wav", clip("capital")), model=MULTI, response_format="verbose_json",
                                         extra_body=SEED)
    assert t.language == "english" and isinstance(t.text, str)
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.translations.create(file=("a.wav", clip("capital")), model=SPEECH)
    assert e.value.body["param"] == "model", e.value.body   # type: ignore[index]


def test_grpc_transcribe_in_one_message_or_in_chunks_and_reflection_lists_it(daemon: DaemonProcess,
                                                                             client: openai.OpenAI) -> None:
    audio = clip("capital")
    want: Any = client.audio.transcriptions.create(file=("a.wav", audio), model=SPEECH, response_format="verbose_json",
                                              timestamp_granularities=["segment"], extra_body=SEED)
    with grpc.insecure_channel(daemon.address) as ch:
        stub = pb_grpc.GeneratorStub(ch)
        one = transcribe(stub, audio, model=SPEECH, timestamps=True, seed=3, request_id="clip-1")
        chunked = transcribe(stub, audio, chunk=4096, timestamps=True, seed=3)
        reply = next(iter(reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(iter(
            [reflection_pb2.ServerReflectionRequest(file_containing_symbol="nvllm.v1.Generator")]), timeout=5)))
    for rs in (one, chunked):
        assert "".join(r.text for r in rs) == want.text
        assert [s.text for r in rs for s in r.segments] == [s.text for s in want.segments]
        last = rs[-1]
        assert last.finish_reason == pb.FINISH_REASON_STOP and last.language == "en"
        assert last.duration_s == pytest.approx(want.duration, abs=1e-3) and last.usage.completion_tokens > 0
    assert {r.request_id for r in one} == {"clip-1"}
    files = [descriptor_pb2.FileDescriptorProto.FromString(b)
             for b in reply.file_descriptor_response.file_descriptor_proto]
    methods = {m.name: m for f in files for s in f.service if s.name == "Generator" for m in s.method}
    assert methods["Transcribe"].client_streaming and methods["Transcribe"].server_streaming


# -- bad input -------------------------------------------------------------------------------------------
BAD_AUDIO = {
    "not audio": b"This is a text file, not audio at all.\n" * 4,
    "empty": b"",
    "truncated": wav_header(data_bytes=320000, sent=1000),          # 10 s claimed, 31 ms sent
    "hours claimed": wav_header(rate=8000, width=1, data_bytes=2**31, sent=64),
    "no channels": wav_header(channels=0, data_bytes=64, sent=64),
    "no rate": wav_header(rate=0, data_bytes=64, sent=64),
    "too long": wav(31, rate=8000, width=1),                         # server.max_audio_seconds is 30
    "a codec not read": b"\x00\x00\x00\x18ftypmp42" + bytes(200),    # an MP4 box
}


@pytest.mark.parametrize("what", sorted(BAD_AUDIO))
def test_bad_audio_is_refused_naming_file_over_http_and_audio_over_grpc(daemon: DaemonProcess, what: str) -> None:
    data = BAD_AUDIO[what]
    r = httpx.post(daemon.http_url + "/v1/audio/transcriptions", files={"file": ("x.wav", data)},
                   data={"model": SPEECH}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "file" and err["message"].startswith("file"), err
    with grpc.insecure_channel(daemon.address) as ch, pytest.raises(grpc.RpcError) as e:
        transcribe(pb_grpc.GeneratorStub(ch), data, chunk=32 << 10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and e.value.details().startswith("audio"), \
        e.value.details()


def test_an_upload_past_the_limit_is_413_naming_file_and_chunks_past_it_are_refused(daemon: DaemonProcess) -> None:
    big = wav(40, noise=True)[: MAX_AUDIO + 1000]
    r = httpx.post(daemon.http_url + "/v1/audio/transcriptions", files={"file": ("big.wav", big)}, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["param"] == "file", r.text
    with grpc.insecure_channel(daemon.address) as ch, pytest.raises(grpc.RpcError) as e:
        transcribe(pb_grpc.GeneratorStub(ch), big, chunk=32 << 10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "server.max_audio_bytes" in e.value.details()
    assert health(daemon.address).state == pb.HealthResponse.STATE_SERVING


def test_a_chat_model_asked_to_transcribe_and_a_speech_model_asked_to_chat_are_refused_naming_model(
        daemon: DaemonProcess, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(file=("a.wav", clip("battery")), model=CHAT)
    assert e.value.body["param"] == "model"   # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=SPEECH, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert e.value.body["param"] == "model"   # type: ignore[index]
    with grpc.insecure_channel(daemon.address) as ch, pytest.raises(grpc.RpcError) as g:
        transcribe(pb_grpc.GeneratorStub(ch), clip("battery"), model=CHAT)
    assert g.value.code() == grpc.StatusCode.INVALID_ARGUMENT and g.value.details().startswith("model")


# -- the voice query ----------------------------------------------------------------------------------------
def test_the_voice_query_answers_as_its_transcript_sent_as_text(daemon: DaemonProcess, client: openai.OpenAI) -> None:
    # seeded: the random Whisper's windows fall back to sampling, whose transcript (and so the chat's length,
    # within tiny-llama's 256 tokens) would otherwise change from run to run
    audio = clip("capital")
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(audio).decode(), "format": "wav"}}
    voice = client.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": [part]}],  # type: ignore
                                           extra_body={"ignore_eos": True}, temperature=0, max_tokens=8,
                                           seed=VOICE_SEED)
    heard = voice.model_extra["nvllm"]["transcripts"]    # type: ignore[index]
    assert [(h["message"], h["part"], h["language"]) for h in heard] == [(0, 0, "en")]
    text = client.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": heard[0]["text"]}],
                                          extra_body={"ignore_eos": True}, temperature=0, max_tokens=8,
                                          seed=VOICE_SEED)
    assert voice.choices[0].message.content == text.choices[0].message.content
    chunks: list[Any] = list(client.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": [part]}],  # type: ignore
                                                 stream=True, extra_body={"ignore_eos": True}, temperature=0,
                                                 max_tokens=8, seed=VOICE_SEED))
    again = chunks[0].model_extra["nvllm"]["transcripts"][0]
    assert again["duration"] == heard[0]["duration"] and again["text"] == heard[0]["text"]   # the seed's
    params = pb.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, seed=VOICE_SEED)
    with grpc.insecure_channel(daemon.address) as ch:
        stub = pb_grpc.GeneratorStub(ch)
        rs = list(stub.Generate(pb.GenerateRequest(model=CHAT, sampling_params=params, chat=pb.ChatMessages(
            messages=[pb.ChatMessage(role="user", audio=clip("battery"))])), timeout=300))
        said = rs[0].transcripts[0].text
        typed = list(stub.Generate(pb.GenerateRequest(model=CHAT, sampling_params=params, chat=pb.ChatMessages(
            messages=[pb.ChatMessage(role="user", content=said)])), timeout=300))
    assert "".join(r.text for r in rs) == "".join(r.text for r in typed)
    bad = httpx.post(daemon.http_url + "/v1/chat/completions", timeout=60, json={"model": CHAT, "messages": [
        {"role": "user", "content": [{"type": "input_audio",
                                      "input_audio": {"data": base64.b64encode(b"no").decode()}}]}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages[0].content[0].input_audio.data"
    all_pages_back(daemon.address)


# -- the speech model as a served model ----------------------------------------------------------------------
def test_the_speech_model_is_in_health_and_metrics_by_name_and_keep_alive_unloads_it(daemon: DaemonProcess) -> None:
    r = httpx.post(daemon.http_url + "/v1/audio/transcriptions", files={"file": ("a.wav", clip("battery"))},
                   data={"model": MULTI, "keep_alive": "0", "seed": "1"}, timeout=300)
    assert r.status_code == 200, r.text
    h = health_when(daemon.address,
                    lambda h: {m.name: m for m in h.models}[MULTI].state == pb.ModelHealth.STATE_UNLOADED,
                    f"{MULTI} unloaded (keep_alive 0)", timeout=30)
    models = {m.name: m for m in h.models}
    assert models[SPEECH].state == pb.ModelHealth.STATE_LOADED and models[SPEECH].requests >= 1
    assert models[MULTI].loads >= 1 and models[CHAT].default
    text = httpx.get(daemon.http_url + "/metrics", timeout=30).text
    names = {s.labels.get("model_name") for f in text_string_to_metric_families(text) for s in f.samples
             if s.name == "vllm:request_success_total"}
    assert {SPEECH, MULTI} <= names
    assert json.loads(httpx.get(daemon.http_url + "/health", timeout=30).text)["models"]


# -- the real tiny.en ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("tiny-en"), tiny, BASE_CONFIG, http_listen="127.0.0.1:0",
                      extra_args=("--model", str(real_whisper())))
    yield d
    d.stop()


def _words(text: str) -> str:
    return " ".join("".join(c for c in text.lower() if c.isalnum() or c == " ").split())


@pytest.mark.parametrize(("name", "said"), [("jfk", "ask not what your country can do for you"),
                                            ("capital", "what is the capital of france")])
def test_the_real_tiny_en_hears_the_clips_as_they_were_said(real: DaemonProcess, name: str, said: str) -> None:
    with openai.OpenAI(base_url=real.http_url + "/v1", api_key="unused", max_retries=0, timeout=300) as c:
        t = c.audio.transcriptions.create(file=(f"{name}.wav", clip(name)), model="whisper-tiny.en")
    assert said in _words(t.text), t.text


def test_the_real_voice_query_hears_the_question_and_answers_it_as_text(real: DaemonProcess) -> None:
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(clip("capital")).decode(), "format": "wav"}}
    with openai.OpenAI(base_url=real.http_url + "/v1", api_key="unused", max_retries=0, timeout=300) as c:
        voice = c.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": [part]}],  # type: ignore
                                          temperature=0, max_tokens=8, extra_body={"ignore_eos": True})
        heard = voice.model_extra["nvllm"]["transcripts"][0]["text"]    # type: ignore[index]
        text = c.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": heard}], temperature=0,
                                         max_tokens=8, extra_body={"ignore_eos": True})
    assert "capital of france" in _words(heard)
    assert voice.choices[0].message.content == text.choices[0].message.content
    all_pages_back(real.address)
