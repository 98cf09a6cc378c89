"""The speech front doors in process without a speech model: a stand-in for a speech model's AsyncEngine that
answers every transcription with the same two windows (`SpeechStub`), served beside a real tiny chat engine
by both front doors (`serve_speech`), so that the HTTP and gRPC shapes, the refusals and the voice query's
two submits are checked without Whisper. The real model's answers are the daemon tests' (test_speech_daemon.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
import httpx2 as httpx
from grpc_health.v1._async import HealthServicer

from nvllm.config import Settings
from nvllm.engine.async_engine import AsyncEngine
from nvllm.engine.llm_engine import LLMEngine
from nvllm.engine.outputs import RequestOutput, Segment
from nvllm.sampling_params import InvalidParameter
from nvllm.server.grpc.service import GeneratorService, add_generator_to_server
from nvllm.server.http.app import OpenAIApi
from nvllm.server.models.model_set import LOADED, ModelSet, ModelSpec
from nvllm.server.models.speech_slot import SpeechSlot
from nvllm.server.state import DaemonState
from nvllm.transcription_params import TranscriptionParams
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

SPEECH, CHAT = "whisper-stub", "tiny-llama"
WINDOWS = (" Hello there.", " How are you?")     # the stub's two windows' texts
HEARD = "Hello there. How are you?"
SECONDS = 2.5


def wav_like(data: bytes) -> bool:
    return data[:4] == b"RIFF"


def segments(timestamps: bool) -> list[Segment]:
    """The stub's segments: timed within the audio, or one per window (no timestamps decoded)."""
    times = [(0.0, 1.25), (1.25, SECONDS)] if timestamps else [(0.0, SECONDS), (0.0, SECONDS)]
    return [Segment(i, 0, a, b, text, [100 + i, 200 + i], 0.0, -0.25, 1.5, 0.01)
            for i, ((a, b), text) in enumerate(zip(times, WINDOWS))]


@dataclass
class _Pending:
    request_id: str
    params: TranscriptionParams
    prompt_tokens: int = 4
    max_tokens: int = 0
    thinks: bool = False


@dataclass
class _Stream:
    outputs: list[RequestOutput]
    closed: list[str] = field(default_factory=list)
    request_id: str = ""

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> RequestOutput:
        if not self.outputs:
            raise StopAsyncIteration
        await asyncio.sleep(0)
        return self.outputs.pop(0)

    def close(self) -> None:
        self.closed.append(self.request_id)


class SpeechStub:
    """What DaemonState and the front doors use of a speech model's AsyncEngine; refuses what the real one
    refuses (audio that is not a WAV here, naming file; anything but a transcription, naming model)."""

    is_running = True
    chat_template = None
    max_model_len = 448
    num_streams = 0

    def __init__(self) -> None:
        self.asked: list[tuple[bytes, TranscriptionParams]] = []
        self.closed: list[str] = []

    def stats(self) -> dict[str, Any]:
        return {"running": 0, "waiting": 0}

    def prepare(self, request_id: str, prompt: Any, params: Any = None, priority: int = 0) -> _Pending:
        if not isinstance(params, TranscriptionParams):
            raise InvalidParameter("model", "whisper-stub", "a model that generates text",
                                   message="model: whisper-stub is a speech model: it only transcribes")
        data = prompt["audio"]
        if not wav_like(data):
            raise InvalidParameter("file", data[:16], "audio", message="file: not an audio file (no format read)")
        self.asked.append((data, params))
        return _Pending(request_id, params)

    def add(self, pending: _Pending) -> _Stream:
        marks = segments(pending.params.timestamps)
        first = RequestOutput(pending.request_id, WINDOWS[0], [101, 102], None, False, None, None, 4, 4, 0,
                              segments=[marks[0]])
        last = RequestOutput(pending.request_id, WINDOWS[1], [103, 104], None, True, "stop", None, 4, 8, 0,
                             segments=[marks[1]], language="en", audio_seconds=SECONDS)
        return _Stream([first, last], self.closed, pending.request_id)


Body = Callable[[httpx.AsyncClient, pb_grpc.GeneratorStub, DaemonState, SpeechStub], Awaitable[Any]]


def serve_speech(chat: LLMEngine | None, body: Body, speech_setting: str = "", max_audio_bytes: int = 1 << 20,
                 speech: bool = True) -> Any:
    """body(http client, gRPC stub, state, the stub) against both front doors over the stub (served as
    whisper-stub, unless speech is False) and the chat engine (tiny-llama, the default), both loaded."""
    async def main() -> Any:
        stub = SpeechStub()
        engines: dict[str, Any] = {}
        if chat is not None:
            engines[CHAT] = AsyncEngine(chat)
            engines[CHAT].start()
        if speech:
            engines[SPEECH] = stub
        names = list(engines)
        specs = [ModelSpec(n, Settings(), -1.0, pinned=True) for n in names]
        models = ModelSet(specs, names[0], 0, _no_load, _no_unload, lambda spec: 0)
        for n, e in engines.items():
            models.slots[n].engine, models.slots[n].phase = cast(AsyncEngine, e), LOADED
        state = DaemonState(names[0], HealthServicer(), 64, 4, 1 << 20)
        state.speech = SpeechSlot(speech_setting, max_audio_bytes, 600.0, is_speech=lambda p: False)
        if speech and not speech_setting:
            state.speech._found = [SPEECH]     # the stub has no files for is_speech to look at
        await state.set_ready(models, None)
        api = OpenAIApi(state, None, 1 << 20, metrics=state.metrics)
        server = grpc.aio.server()
        add_generator_to_server(GeneratorService(state), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        transport = httpx.ASGITransport(app=api.app(), client=("127.0.0.1", 5000))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://nvllm", timeout=60) as client, \
                    grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                return await body(client, pb_grpc.GeneratorStub(channel), state, stub)
        finally:
            await server.stop(0)
            if CHAT in engines:
                engines[CHAT].shutdown()
    return asyncio.run(main())


async def _no_load(spec: ModelSpec, free: int) -> tuple[AsyncEngine, int]:
    raise AssertionError("every model is loaded")


async def _no_unload(engine: AsyncEngine) -> None:
    raise AssertionError("nothing is unloaded")
