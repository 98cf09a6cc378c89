"""Transcribe: speech to text over gRPC. The request stream read (its first message's options, every
message's audio in order, refused as soon as the chunks together pass server.max_audio_bytes, so no more than
the limit is held; what a refused client still sends is read and dropped, up to the limit again, so that it
gets the refusal rather than a broken stream), then the audio as one engine request through
DaemonState.submit (server/transcribing.py; the engine decodes and refuses bad audio, naming file: here audio),
its outputs streamed as TranscribeResponses.

INVALID_ARGUMENT names the field (audio, model, language, temperature, ...), NOT_FOUND a model not served,
RESOURCE_EXHAUSTED load (a full queue, memory pressure, the client's streams) and UNAVAILABLE starting or
draining, as for Generate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from nvllm.engine.async_engine import EngineDead
from nvllm.engine.outputs import RequestOutput, Segment
from nvllm.sampling_params import InvalidParameter
from nvllm.server.clients import client_key
from nvllm.server.grpc.generate_request import MAX_REQUEST_ID_CHARS, BadRequest, read_keep_alive
from nvllm.server.grpc.wire import UndecodableRequest, decoder
from nvllm.server.logs import request_context
from nvllm.server.models.model_set import UnknownModel
from nvllm.server.models.speech_slot import NoSpeechModel
from nvllm.server.state import DaemonState, Refused
from nvllm.server.transcribing import Transcript, TranscriptionFailed, submit_transcription
from nvllm.transcription_params import TranscriptionParams
from nvllm.v1 import nvllm_pb2 as pb

log = logging.getLogger("nvllm.server.service")

decode_transcribe_request = decoder(pb.TranscribeRequest)
_OPTIONS = frozenset(pb.TranscribeRequest.DESCRIPTOR.fields_by_name) - {"audio"}
# The engine's names -> the proto's (the audio is file to the engine; a model that cannot translate: model).
_FIELDS = {"file": "audio", "task": "model"}


@dataclass
class TranscribeArgs:
    request_id: str
    model: str
    audio: bytes
    params: TranscriptionParams
    priority: int
    keep_alive_s: float | None


async def read_stream(requests: AsyncIterator[Any], max_audio_bytes: int, max_message_bytes: int) -> TranscribeArgs:
    """The stream read whole: the first message's options and every message's audio; BadRequest naming the
    field."""
    first: pb.TranscribeRequest | None = None
    chunks: list[bytes] = []
    size = 0
    async for message in requests:
        if isinstance(message, UndecodableRequest):
            raise BadRequest(message.field, message.message)
        if message.ByteSize() > max_message_bytes:
            raise BadRequest("audio", f"a message is {message.ByteSize()} bytes; each may be at most "
                                      f"{max_message_bytes} (server.max_message_bytes): send the audio in chunks")
        if first is None:
            first = message
        else:
            late = [f.name for f, _ in message.ListFields() if f.name in _OPTIONS]
            if late:
                raise BadRequest(late[0], f"{late[0]} is read from the first message only")
        size += len(message.audio)
        if size > max_audio_bytes:
            raise BadRequest("audio", f"audio: the upload is larger than {max_audio_bytes} bytes "
                                      "(server.max_audio_bytes)")
        chunks.append(message.audio)
    if first is None:
        raise BadRequest("audio", "audio: no message was sent (the first carries the options and the audio)")
    if not size:
        raise BadRequest("audio", "audio: the upload is empty")
    if len(first.request_id) > MAX_REQUEST_ID_CHARS:
        raise BadRequest("request_id", f"request_id must be at most {MAX_REQUEST_ID_CHARS} characters")
    try:
        temperature = first.temperature if first.HasField("temperature") else None
        params = TranscriptionParams.at_temperature(temperature, task=first.task or "transcribe",
                                                    language=first.language or None, prompt=first.prompt or None,
                                                    timestamps=first.timestamps,
                                                    seed=_seed(first.seed) if first.HasField("seed") else None)
    except InvalidParameter as e:
        raise BadRequest(e.field, str(e)) from None
    return TranscribeArgs(first.request_id or uuid.uuid4().hex, first.model, b"".join(chunks), params,
                          first.priority, read_keep_alive(first.keep_alive))


def _seed(seed: int) -> int:
    if seed < 0:
        raise BadRequest("seed", f"seed must be at least 0, got {seed}")
    return seed


def refused(e: InvalidParameter) -> BadRequest:
    """The engine's refusal naming the proto's field."""
    field = _FIELDS.get(e.field, e.field)
    text = str(e)
    return BadRequest(field, field + text[len(e.field):] if text.startswith(e.field) else f"{field}: {text}")


def segment_message(s: Segment) -> pb.TranscriptSegment:
    return pb.TranscriptSegment(id=s.id, seek=s.seek, start=s.start, end=s.end, text=s.text, tokens=s.tokens,
                                temperature=s.temperature, avg_logprob=s.avg_logprob,
                                compression_ratio=s.compression_ratio, no_speech_prob=s.no_speech_prob)


def response(rid: str, transcript: Transcript, delta: str, out: RequestOutput) -> pb.TranscribeResponse:
    r = pb.TranscribeResponse(request_id=rid, text=delta, segments=[segment_message(s) for s in out.segments or ()])
    if out.finished:
        r.finish_reason = pb.FINISH_REASON_STOP
        r.language = transcript.language or ""
        r.duration_s = transcript.seconds or 0.0
        r.usage.prompt_tokens = transcript.prompt_tokens
        r.usage.completion_tokens = transcript.completion_tokens
    return r


async def _drain(requests: AsyncIterator[Any], budget: int, most: int = 1024) -> None:
    """What the client is still sending, read and dropped (at most budget bytes in most messages): a call ended
    while its client still writes reaches the client as INTERNAL, not as the refusal."""
    async for message in requests:
        budget -= 0 if isinstance(message, UndecodableRequest) else message.ByteSize()
        most -= 1
        if budget < 0 or most <= 0:
            return


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    await context.abort(code, details)
    raise AssertionError("context.abort returned")


async def transcribe(state: DaemonState, requests: AsyncIterator[Any],
                     context: grpc.aio.ServicerContext) -> AsyncGenerator[pb.TranscribeResponse, None]:
    """The Transcribe RPC's responses."""
    t0, st = time.monotonic(), state
    try:
        st.check_serving()    # before reading megabytes of audio
        args = await read_stream(requests, st.speech.max_audio_bytes, st.max_message_bytes)
        model = args.model or await st.speech.model(st.models)
    except (BadRequest, NoSpeechModel, Refused) as e:
        await _drain(requests, st.speech.max_audio_bytes)
        log.info("refused: %s", e)
        st.metrics.request("grpc", t0).refused("unavailable" if isinstance(e, Refused) else "invalid")
        await _abort(context, grpc.StatusCode.UNAVAILABLE if isinstance(e, Refused)
                     else grpc.StatusCode.INVALID_ARGUMENT, str(e))
    rid = args.request_id
    with request_context(rid):
        try:
            sub = await submit_transcription(st, "grpc", client_key(context.peer()), rid, args.audio, args.params,
                                             model, t0, refused, args.priority, args.keep_alive_s)
        except BadRequest as e:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except UnknownModel as e:
            await _abort(context, grpc.StatusCode.NOT_FOUND, str(e))
        except Refused as e:
            await _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED if e.busy else grpc.StatusCode.UNAVAILABLE,
                         str(e))
        except EngineDead as e:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, str(e))
        transcript = Transcript()
        try:
            async with sub, contextlib.aclosing(aiter(sub)) as outputs:
                async for _, out in outputs:
                    try:
                        delta = transcript.add(out)
                    except TranscriptionFailed as e:
                        await _abort(context, grpc.StatusCode.UNAVAILABLE if e.aborted else grpc.StatusCode.INTERNAL,
                                     str(e))
                    if delta or out.segments or out.finished:
                        yield response(rid, transcript, delta, out)
        except asyncio.CancelledError:
            log.info("cancelled (client went away or its deadline passed); request aborted")
            raise
        log.info("finished: %.1f s of audio, %d prompt + %d output tokens", transcript.seconds or 0.0,
                 transcript.prompt_tokens, transcript.completion_tokens)
