"""The voice query over gRPC: a Generate chat whose messages carry audio (ChatMessage.audio) heard through
server/voice.py before the chat is read, each transcript put after the message's content (joined by a newline,
as the HTTP API joins a message's text parts) and its audio cleared; what was heard goes on the first
GenerateResponse (transcripts). Elsewhere (Tokenize) a chat's audio is refused, naming it."""

from __future__ import annotations

import grpc

from nvllm.engine.async_engine import EngineDead
from nvllm.server.models.model_set import UnknownModel
from nvllm.server.state import DaemonState, Refused
from nvllm.server.transcribing import TranscriptionFailed
from nvllm.server.voice import Clip, Heard, VoiceRefused, hear
from nvllm.v1 import nvllm_pb2 as pb


class ChatAudioRefused(Exception):
    """Hearing a chat's audio failed: the status and details to abort the call with."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def audio_clips(request: pb.GenerateRequest) -> list[Clip]:
    if request.WhichOneof("input") != "chat":
        return []
    return [Clip(m.audio, f"chat.messages[{i}].audio", i) for i, m in enumerate(request.chat.messages) if m.audio]


def put_heard(request: pb.GenerateRequest, heard: list[Heard]) -> None:
    for h in heard:
        m = request.chat.messages[h.clip.message]
        m.content = f"{m.content}\n{h.text}" if m.content else h.text
        m.ClearField("audio")


def transcripts(heard: list[Heard]) -> list[pb.Transcript]:
    return [pb.Transcript(message_index=h.clip.message, text=h.text, language=h.language or "",
                          duration_s=h.seconds or 0.0) for h in heard]


async def hear_chat(state: DaemonState, request: pb.GenerateRequest, client: str, request_id: str,
                    arrival: float) -> list[pb.Transcript]:
    """The chat's audio heard and replaced by its transcripts (none: nothing done); ChatAudioRefused for what is
    refused or fails."""
    clips = audio_clips(request)
    if not clips:
        return []
    try:
        seed = request.sampling_params.seed if request.sampling_params.HasField("seed") else None
        heard = await hear(state, "grpc", client, request_id, clips, arrival, request.priority, seed)
    except VoiceRefused as e:
        raise ChatAudioRefused(grpc.StatusCode.INVALID_ARGUMENT, e.message) from None
    except UnknownModel as e:
        raise ChatAudioRefused(grpc.StatusCode.NOT_FOUND, str(e)) from None
    except Refused as e:
        raise ChatAudioRefused(grpc.StatusCode.RESOURCE_EXHAUSTED if e.busy else grpc.StatusCode.UNAVAILABLE,
                               str(e)) from None
    except (EngineDead, TranscriptionFailed) as e:
        failed = isinstance(e, TranscriptionFailed) and not e.aborted
        raise ChatAudioRefused(grpc.StatusCode.INTERNAL if failed else grpc.StatusCode.UNAVAILABLE, str(e)) from None
    put_heard(request, heard)
    return transcripts(heard)
