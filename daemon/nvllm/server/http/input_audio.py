"""The voice query over HTTP: OpenAI chat's `input_audio` content parts ({"type": "input_audio", "input_audio":
{"data": base64, "format": "wav"}}) heard through server/voice.py before the chat is submitted, each part then
a text part holding its transcript; and the answer, whole or streamed, saying what was heard in a field of
nvllm's own beside OpenAI's (OpenAI's chat has none for it; clients keep unknown fields):

    "nvllm": {"transcripts": [{"message": 0, "part": 1, "text": "...", "language": "en", "duration": 2.1}]}

on the response object, or on the stream's first chunk. Only /v1/chat/completions hears audio; the Responses and
Messages dialects refuse an audio part as any part they do not read (400 naming its type).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from nvllm.engine.async_engine import EngineDead
from nvllm.engine.outputs import RequestOutput
from nvllm.server.http.dialect import Answering, Event
from nvllm.server.http.errors import ApiError, bad_request
from nvllm.server.models.model_set import UnknownModel
from nvllm.server.state import DaemonState, Refused
from nvllm.server.transcribing import TranscriptionFailed
from nvllm.server.voice import Clip, Heard, VoiceRefused, hear

AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg", "opus")   # what the engine's decoder reads (it reads the bytes' own)


def audio_clips(body: dict[str, Any]) -> list[Clip]:
    """The body's input_audio parts, decoded from base64; 400 naming the part for a malformed one. Shapes
    the chat reader refuses anyway (messages not a list, ...) are left to it."""
    messages = body.get("messages")
    clips: list[Clip] = []
    for i, m in enumerate(messages if isinstance(messages, list) else []):
        content = m.get("content") if isinstance(m, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and part.get("type") == "input_audio":
                at = f"messages[{i}].content[{j}]"
                clips.append(Clip(_audio(part, at), f"{at}.input_audio.data", i, j))
    return clips


def _audio(part: dict[str, Any], at: str) -> bytes:
    for key in part:
        if key not in ("type", "input_audio"):
            raise bad_request(f"{at}.{key}"[:80], f"{at}.{key[:64]}: unknown parameter", "unknown_parameter")
    audio = part.get("input_audio")
    if not isinstance(audio, dict):
        raise bad_request(f"{at}.input_audio", f"{at}.input_audio must be an object: {{\"data\": base64, "
                                               f"\"format\": \"wav\"}}")
    for key in audio:
        if key not in ("data", "format"):
            raise bad_request(f"{at}.input_audio.{key}"[:80], f"{at}.input_audio.{key[:64]}: unknown parameter",
                              "unknown_parameter")
    fmt = audio.get("format")
    if fmt is not None and fmt not in AUDIO_FORMATS:
        raise bad_request(f"{at}.input_audio.format", f"{at}.input_audio.format must be one of "
                                                      f"{', '.join(AUDIO_FORMATS)}, got {str(fmt)[:32]!r}")
    data = audio.get("data")
    if not isinstance(data, str) or not data:
        raise bad_request(f"{at}.input_audio.data", f"{at}.input_audio.data must be the audio's bytes in base64")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{at}.input_audio.data", f"{at}.input_audio.data is not valid base64") from None


def put_heard(body: dict[str, Any], heard: list[Heard]) -> None:
    """Each heard part replaced by a text part holding its transcript (the engine joins a message's text parts
    with newlines, so a message of one audio part reads as its transcript alone)."""
    for h in heard:
        assert h.clip.part is not None      # HTTP's clips are content parts
        body["messages"][h.clip.message]["content"][h.clip.part] = {"type": "text", "text": h.text}


def transcripts(heard: list[Heard]) -> dict[str, Any]:
    return {"transcripts": [{"message": h.clip.message, "part": h.clip.part, "text": h.text,
                             "language": h.language, "duration": round(h.seconds or 0.0, 3)} for h in heard]}


async def hear_chat(state: DaemonState, body: dict[str, Any], client: str, request_id: str, arrival: float,
                    refusal: Callable[[Refused], ApiError]) -> list[Heard]:
    """The body's audio parts heard and replaced by their transcripts (none: nothing done); ApiError for what
    is refused (400 naming the part or model, and as app.py maps a Refused)."""
    try:
        clips = audio_clips(body)
    except ApiError:
        state.metrics.request("http", arrival=arrival).refused("invalid")
        raise
    if not clips:
        return []
    priority, seed = body.get("priority"), body.get("seed")
    try:
        heard = await hear(state, "http", client, request_id, clips, arrival,
                           priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
                           seed if isinstance(seed, int) and not isinstance(seed, bool) else None)
    except VoiceRefused as e:
        raise bad_request(e.field, e.message) from None
    except Refused as e:
        raise refusal(e) from None
    except UnknownModel as e:
        raise ApiError(404, str(e), "model", "model_not_found") from None
    except (EngineDead, TranscriptionFailed) as e:
        failed = isinstance(e, TranscriptionFailed) and not e.aborted
        raise ApiError(500 if failed else 503, str(e), code="engine_error" if failed else "unavailable") from None
    put_heard(body, heard)
    return heard


class HeardAnswer:
    """A chat's answer (any Answering of dialect.py) with what was heard on the response, or on the stream's
    first chunk."""

    def __init__(self, answer: Answering, heard: list[Heard]) -> None:
        self.answer = answer
        self.heard = transcripts(heard)
        self.told = False

    def add(self, index: int, out: RequestOutput) -> None:
        self.answer.add(index, out)

    def response(self) -> dict[str, Any]:
        return {**self.answer.response(), "nvllm": self.heard}

    def events(self, index: int, out: RequestOutput) -> list[Event]:
        events = self.answer.events(index, out)
        if events and not self.told:
            first = json.loads(events[0]["data"])
            if isinstance(first, dict):
                self.told = True
                events[0] = {**events[0], "data": json.dumps({**first, "nvllm": self.heard}, ensure_ascii=False)}
        return events

    def closing(self) -> list[Event]:
        return self.answer.closing()

    def failed(self, e: ApiError) -> Event:
        return self.answer.failed(e)

    def token_counts(self) -> tuple[int, int]:
        return self.answer.token_counts()
