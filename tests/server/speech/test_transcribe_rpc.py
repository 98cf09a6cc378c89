"""gRPC's Transcribe in process (server/grpc/transcribe_rpc.py) over a stand-in speech model
(helpers/speech_stub.py): the audio in one message or in chunks, the options from the first, the answer
streamed as text and segments with the language, duration and usage last; and each refusal with its status and
field. The proto's shape and the reading of the request stream are checked without a server too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from helpers.speech_stub import CHAT, HEARD, SECONDS, SPEECH, WINDOWS, serve_speech
from nvllm import LLM
from nvllm.engine.llm_engine import LLMEngine
from nvllm.server.grpc.generate_request import BadRequest
from nvllm.server.grpc.transcribe_rpc import decode_transcribe_request, read_stream
from nvllm.server.grpc.wire import UndecodableRequest
from nvllm.v1 import nvllm_pb2 as pb

WAV = b"RIFF" + bytes(60)


@pytest.fixture(scope="module")
def engine(tiny_models: dict[str, Path]) -> LLMEngine:
    return LLM(tiny_models["tiny-llama"], num_blocks=64, max_num_seqs=4).engine


def test_transcribe_streams_both_ways_beside_generate() -> None:
    service = pb.DESCRIPTOR.services_by_name["Generator"]
    method = service.methods_by_name["Transcribe"]
    assert method.client_streaming and method.server_streaming
    assert method.input_type.name == "TranscribeRequest" and method.output_type.name == "TranscribeResponse"
    assert pb.ChatMessage.DESCRIPTOR.fields_by_name["audio"].type == pb.ChatMessage.DESCRIPTOR.fields_by_name[
        "audio"].TYPE_BYTES
    assert pb.GenerateResponse.DESCRIPTOR.fields_by_name["transcripts"].message_type.name == "Transcript"
    assert pb.TranscribeRequest().HasField("temperature") is False     # unset: Whisper's fallback


async def _messages(items: Sequence[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


def read(items: Sequence[Any], max_audio: int = 1000, max_message: int = 500) -> Any:
    return asyncio.run(read_stream(_messages(items), max_audio, max_message))


def test_the_stream_is_the_first_messages_options_and_every_chunk_in_order() -> None:
    args = read([pb.TranscribeRequest(model="m", language="de", prompt="p", temperature=0.5, timestamps=True,
                                      task="translate", priority=-1, keep_alive="5m", request_id="r1", audio=b"ab",
                                      seed=9),
                 pb.TranscribeRequest(audio=b"cd"), pb.TranscribeRequest(audio=b"e")])
    assert (args.model, args.audio, args.request_id, args.priority, args.keep_alive_s) == ("m", b"abcde", "r1", -1,
                                                                                            300.0)
    p = args.params
    assert (p.task, p.language, p.prompt, p.temperature, p.timestamps, p.seed) == \
        ("translate", "de", "p", (0.5,), True, 9)
    greedy = read([pb.TranscribeRequest(audio=b"x", temperature=0)])
    assert greedy.params.temperature[0] == 0.0 and len(greedy.params.temperature) == 6 and greedy.request_id


@pytest.mark.parametrize(("items", "field", "says"), [
    ([], "audio", "no message"),
    ([pb.TranscribeRequest(model="m")], "audio", "empty"),
    ([pb.TranscribeRequest(audio=b"a"), pb.TranscribeRequest(audio=b"b", language="en")], "language", "first message"),
    ([pb.TranscribeRequest(audio=bytes(400)), pb.TranscribeRequest(audio=bytes(400)),
      pb.TranscribeRequest(audio=bytes(400))], "audio", "server.max_audio_bytes"),
    ([pb.TranscribeRequest(audio=bytes(600))], "audio", "in chunks"),
    ([pb.TranscribeRequest(audio=b"a", task="summarize")], "task", "transcribe, translate"),
    ([pb.TranscribeRequest(audio=b"a", temperature=3)], "temperature", "from 0 to 1"),
    ([pb.TranscribeRequest(audio=b"a", keep_alive="soon")], "keep_alive", "duration"),
    ([pb.TranscribeRequest(audio=b"a", seed=-3)], "seed", "at least 0"),
    ([pb.TranscribeRequest(audio=b"a", request_id="r" * 200)], "request_id", "at most"),
    ([UndecodableRequest("prompt", "prompt: must be valid UTF-8")], "prompt", "UTF-8"),
])
def test_a_bad_stream_is_refused_naming_its_field(items: list[Any], field: str, says: str) -> None:
    with pytest.raises(BadRequest) as e:
        read(items)
    assert e.value.field == field and says in str(e.value), str(e.value)


def test_the_third_chunk_past_the_limit_is_never_taken() -> None:
    taken: list[int] = []

    async def endless() -> AsyncIterator[Any]:
        for i in range(10_000):
            taken.append(i)
            yield pb.TranscribeRequest(audio=bytes(400))
    with pytest.raises(BadRequest):
        asyncio.run(read_stream(endless(), 1000, 500))
    assert len(taken) == 3


def test_a_string_field_that_is_not_utf8_is_named() -> None:
    good = pb.TranscribeRequest(prompt="x", audio=b"\xff").SerializeToString()
    bad = good.replace(b"x", b"\xff", 1)
    found = decode_transcribe_request(bad)
    assert isinstance(found, UndecodableRequest) and found.field == "prompt"


async def collect(stub: Any, messages: Sequence[pb.TranscribeRequest]) -> list[pb.TranscribeResponse]:
    return [r async for r in stub.Transcribe(_messages(messages))]


def test_transcribe_answers_with_text_and_segments_then_the_language_and_duration(engine: LLMEngine) -> None:
    async def body(http, stub, state, speech) -> Any:
        one = await collect(stub, [pb.TranscribeRequest(audio=WAV, request_id="mine", timestamps=True)])
        chunked = await collect(stub, [pb.TranscribeRequest(model=SPEECH, audio=WAV[:10]),
                                       pb.TranscribeRequest(audio=WAV[10:30]), pb.TranscribeRequest(audio=WAV[30:])])
        return one, chunked, [a for a, _ in speech.asked], state.streams_by_client
    one, chunked, audio, streams = serve_speech(engine, body)
    assert audio == [WAV, WAV] and streams == {}
    assert "".join(r.text for r in one) == "".join(r.text for r in chunked) == HEARD
    assert [r.request_id for r in one] == ["mine", "mine"]
    assert [s.text for r in one for s in r.segments] == list(WINDOWS)
    assert [(s.start, s.end) for r in one for s in r.segments] == [(0.0, 1.25), (1.25, SECONDS)]
    last = one[-1]
    assert last.finish_reason == pb.FINISH_REASON_STOP and one[0].finish_reason == pb.FINISH_REASON_UNSPECIFIED
    assert (last.language, last.duration_s, last.usage.prompt_tokens, last.usage.completion_tokens) == \
        ("en", SECONDS, 4, 8)


@pytest.mark.parametrize(("messages", "code", "says"), [
    ([pb.TranscribeRequest(audio=b"not audio at all")], grpc.StatusCode.INVALID_ARGUMENT, "audio: not an audio file"),
    ([pb.TranscribeRequest(audio=WAV, model=CHAT)], grpc.StatusCode.INVALID_ARGUMENT, "model"),
    ([pb.TranscribeRequest(audio=WAV, model="nope")], grpc.StatusCode.NOT_FOUND, "does not exist"),
    ([pb.TranscribeRequest(audio=WAV), pb.TranscribeRequest(audio=WAV, model=SPEECH)],
     grpc.StatusCode.INVALID_ARGUMENT, "model is read from the first message only"),
    ([pb.TranscribeRequest(audio=bytes(5000))], grpc.StatusCode.INVALID_ARGUMENT, "server.max_audio_bytes"),
])
def test_transcribe_refuses_naming_the_field(engine: LLMEngine, messages: list[pb.TranscribeRequest],
                                             code: grpc.StatusCode, says: str) -> None:
    async def body(http, stub, state, speech) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await collect(stub, messages)
        return e.value
    e = serve_speech(engine, body, max_audio_bytes=4096)
    assert e.code() == code and says in e.details(), e.details()


def test_transcribe_with_no_speech_model_is_refused_naming_model(engine: LLMEngine) -> None:
    async def body(http, stub, state, speech) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await collect(stub, [pb.TranscribeRequest(audio=WAV)])
        return e.value
    e = serve_speech(engine, body, speech=False)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details().startswith("model:")


def test_a_refusal_reaches_a_client_still_sending(engine: LLMEngine) -> None:
    """The call refused at its first message while the client writes more: the client gets the refusal (what it
    still sends, up to the upload limit again, is read and dropped), not a broken stream (INTERNAL)."""
    async def body(http, stub, state, speech) -> list[grpc.StatusCode]:
        codes = []
        for k in range(40):
            bad = [pb.TranscribeRequest(audio=b"a", seed=-1)] if k % 2 else [pb.TranscribeRequest(audio=bytes(5000))]
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await collect(stub, bad + [pb.TranscribeRequest(audio=bytes(500)) for _ in range(6)])
            codes.append(e.value.code())
        return codes
    assert set(serve_speech(engine, body, max_audio_bytes=4096)) == {grpc.StatusCode.INVALID_ARGUMENT}
