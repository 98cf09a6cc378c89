"""The voice query in process (server/voice.py, http/input_audio.py, grpc/chat_audio.py): a chat message's audio
transcribed by the speech model (a stand-in: helpers/speech_stub.py) and answered by the real tiny chat model,
the answer equal to the one the transcript sent as text gets (greedy), what was heard on the response; and
the refusals, naming the audio's own field or model."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import grpc
import httpx2 as httpx
import pytest

from helpers.speech_stub import CHAT, HEARD, SECONDS, serve_speech
from nvllm import LLM
from nvllm.engine.llm_engine import LLMEngine
from nvllm.v1 import nvllm_pb2 as pb

WAV = b"RIFF" + bytes(60)
B64 = base64.b64encode(WAV).decode()
GREEDY = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tiny_models: dict[str, Path]) -> LLMEngine:
    return LLM(tiny_models["tiny-llama"], num_blocks=64, max_num_seqs=4).engine


def spoken(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(parts)}]


AUDIO_PART = {"type": "input_audio", "input_audio": {"data": B64, "format": "wav"}}


def test_the_answer_to_a_spoken_question_is_the_answer_to_its_transcript(engine: LLMEngine) -> None:
    async def body(http: httpx.AsyncClient, stub, state, speech) -> Any:
        voice = await http.post("/v1/chat/completions", json={"model": CHAT, "messages": spoken(AUDIO_PART), **GREEDY})
        text = await http.post("/v1/chat/completions",
                               json={"model": CHAT, "messages": [{"role": "user", "content": HEARD}], **GREEDY})
        mixed = await http.post("/v1/chat/completions", json={
            "model": CHAT, "messages": spoken({"type": "text", "text": "Answer:"}, AUDIO_PART), **GREEDY})
        typed = await http.post("/v1/chat/completions", json={
            "model": CHAT, "messages": [{"role": "user", "content": "Answer:\n" + HEARD}], **GREEDY})
        return voice, text, mixed, typed, len(speech.asked), state.streams_by_client
    voice, text, mixed, typed, asked, streams = serve_speech(engine, body)
    assert voice.status_code == 200, voice.text
    v, t = voice.json(), text.json()
    assert v["choices"][0]["message"]["content"] == t["choices"][0]["message"]["content"]
    assert v["usage"]["prompt_tokens"] == t["usage"]["prompt_tokens"]
    assert v["nvllm"] == {"transcripts": [{"message": 0, "part": 0, "text": HEARD, "language": "en",
                                           "duration": SECONDS}]}
    assert "nvllm" not in t
    # A text part beside the audio: the parts joined as the engine joins text parts (a newline).
    assert mixed.json()["choices"][0]["message"]["content"] == typed.json()["choices"][0]["message"]["content"]
    assert mixed.json()["nvllm"]["transcripts"][0]["part"] == 1
    assert asked == 2 and streams == {}


def test_a_streamed_voice_query_says_what_was_heard_on_its_first_chunk(engine: LLMEngine) -> None:
    async def body(http: httpx.AsyncClient, stub, state, speech) -> Any:
        r = await http.post("/v1/chat/completions",
                            json={"model": CHAT, "messages": spoken(AUDIO_PART), "stream": True, **GREEDY})
        t = await http.post("/v1/chat/completions", json={
            "model": CHAT, "messages": [{"role": "user", "content": HEARD}], **GREEDY})
        return r, t
    r, t = serve_speech(engine, body)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert chunks[0]["nvllm"]["transcripts"][0]["text"] == HEARD
    assert all("nvllm" not in c for c in chunks[1:])
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == t.json()["choices"][0]["message"]["content"]


BAD_PARTS = [   # (the part, its param, what the message says)
    ({"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}}, "input_audio.data", "base64"),
    ({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}, "input_audio.data", "base64"),
    ({"type": "input_audio", "input_audio": {"data": B64, "format": "aiff"}}, "input_audio.format", "wav, mp3"),
    ({"type": "input_audio", "input_audio": {"data": B64, "rate": 16000}}, "input_audio.rate", "unknown"),
    ({"type": "input_audio", "input_audio": "x"}, "input_audio", "object"),
    ({"type": "input_audio", "input_audio": {"data": base64.b64encode(b"not audio").decode()}}, "input_audio.data",
     "not an audio file"),
]


@pytest.mark.parametrize(("part", "param", "says"), BAD_PARTS, ids=[f"{c[1]}-{i}" for i, c in enumerate(BAD_PARTS)])
def test_a_bad_audio_part_is_refused_naming_it(engine: LLMEngine, part: dict[str, Any], param: str,
                                               says: str) -> None:
    async def body(http: httpx.AsyncClient, stub, state, speech) -> httpx.Response:
        return await http.post("/v1/chat/completions", json={"model": CHAT, "messages": spoken(
            {"type": "text", "text": "hi"}, part), **GREEDY})
    r = serve_speech(engine, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == f"messages[0].content[1].{param}" and says in err["message"], err


def test_audio_with_no_speech_model_served_is_refused_naming_model(engine: LLMEngine) -> None:
    async def body(http: httpx.AsyncClient, stub, state, speech) -> Any:
        r = await http.post("/v1/chat/completions", json={"model": CHAT, "messages": spoken(AUDIO_PART), **GREEDY})
        m = pb.ChatMessage(role="user", audio=WAV)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            async for _ in stub.Generate(pb.GenerateRequest(chat=pb.ChatMessages(messages=[m]))):
                pass
        return r, e.value
    r, e = serve_speech(engine, body, speech=False)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
    assert "no speech model is served" in r.json()["error"]["message"]
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details().startswith("model:")


def test_the_other_dialects_refuse_an_audio_part(engine: LLMEngine) -> None:
    async def body(http: httpx.AsyncClient, stub, state, speech) -> list[httpx.Response]:
        return [await http.post("/v1/responses", json={"model": CHAT, "input": [{"role": "user", "content": [
                    {"type": "input_audio", "input_audio": {"data": B64, "format": "wav"}}]}]}),
                await http.post("/v1/messages", json={"model": CHAT, "max_tokens": 4, "messages": [
                    {"role": "user", "content": [{"type": "input_audio", "source": {"data": B64}}]}]}),
                await http.post("/v1/completions", json={"model": CHAT, "prompt": [AUDIO_PART]})]
    for r in serve_speech(engine, body):
        assert r.status_code == 400, r.text


def grpc_text(responses: list[pb.GenerateResponse]) -> str:
    return "".join(r.text for r in responses)


def test_a_grpc_chat_message_with_audio_is_heard_and_answered(engine: LLMEngine) -> None:
    params = pb.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

    async def body(http, stub, state, speech) -> Any:
        async def generate(*messages: pb.ChatMessage) -> list[pb.GenerateResponse]:
            request = pb.GenerateRequest(model=CHAT, sampling_params=params, chat=pb.ChatMessages(messages=messages))
            return [r async for r in stub.Generate(request)]
        voice = await generate(pb.ChatMessage(role="user", audio=WAV))
        text = await generate(pb.ChatMessage(role="user", content=HEARD))
        both = await generate(pb.ChatMessage(role="user", content="Answer:", audio=WAV))
        typed = await generate(pb.ChatMessage(role="user", content="Answer:\n" + HEARD))
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await generate(pb.ChatMessage(role="system", content="x"), pb.ChatMessage(role="user", audio=b"junk"))
        with pytest.raises(grpc.aio.AioRpcError) as tokenize:
            await stub.Tokenize(pb.TokenizeRequest(model=CHAT, chat=pb.ChatMessages(
                messages=[pb.ChatMessage(role="user", audio=WAV)])))
        return voice, text, both, typed, bad.value, tokenize.value
    voice, text, both, typed, bad, tokenize = serve_speech(engine, body)
    assert grpc_text(voice) == grpc_text(text) and grpc_text(both) == grpc_text(typed)
    heard = voice[0].transcripts
    assert [(h.message_index, h.text, h.language, h.duration_s) for h in heard] == [(0, HEARD, "en", SECONDS)]
    assert all(not r.transcripts for r in voice[1:]) and not text[0].transcripts
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT and bad.details().startswith("chat.messages[1].audio")
    assert tokenize.code() == grpc.StatusCode.INVALID_ARGUMENT and "chat.messages[0].audio" in tokenize.details()
