"""OpenAI's /v1/audio/transcriptions and /v1/audio/translations form read into the audio's bytes and
TranscriptionParams: the multipart body read in chunks and refused (413 naming file) as soon as it passes
server.max_audio_bytes, so no more than the limit is ever held; then the fields, each checked and refused with
a 400 naming it. The audio itself is the engine's to decode (and to refuse, naming file).

Mapped: file, model, language, prompt, response_format (json, text, srt, vtt, verbose_json), temperature (0:
Whisper's fallback from 0, as OpenAI's; above 0: that alone), timestamp_granularities[] (segment), stream
(transcriptions: transcript.text.delta and .done events). nvllm's own: priority, keep_alive, seed (of the
draws of a window decoded above temperature 0, so that a fallback is reproducible). Refused with a
400 naming them: word timestamps, include[] logprobs, diarized_json, a chunking_strategy other than auto, and
every field OpenAI's translations do not take on /translations.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect, Request

from nvllm.sampling_params import InvalidParameter
from nvllm.server.chat.field_error import FieldError
from nvllm.server.http.errors import ApiError, bad_request
from nvllm.server.models.keep_alive import keep_alive_seconds
from nvllm.transcription_params import TranscriptionParams

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
TIMED = ("srt", "vtt", "verbose_json")    # the formats whose segments carry times: timestamps are decoded
FORM_SLACK = 64 << 10      # the form's other fields and its framing, beyond the file
MAX_FIELDS = 32
TRUE, FALSE = ("true", "1"), ("false", "0")
TRANSCRIPTION_FIELDS = {"file", "model", "language", "prompt", "response_format", "temperature",
                        "timestamp_granularities[]", "timestamp_granularities", "stream", "include[]", "include",
                        "chunking_strategy", "priority", "keep_alive", "seed"}
TRANSLATION_FIELDS = {"file", "model", "prompt", "response_format", "temperature", "priority", "keep_alive", "seed"}
_REPEATED = {"timestamp_granularities[]", "timestamp_granularities", "include[]", "include"}


@dataclass
class TranscriptionAsk:
    """A transcription or translation request read."""
    audio: bytes
    params: TranscriptionParams
    model: str | None            # None: the speech model (server.speech_model, or the only one)
    response_format: str = "json"
    stream: bool = False
    priority: int = 0
    keep_alive_s: float | None = None

    @property
    def task(self) -> str:
        return self.params.task

    def refusal(self, e: InvalidParameter) -> ApiError:
        """The engine's refusal as a 400 naming the form's field (file for the audio; a model that cannot
        translate is refused naming model)."""
        field = {"task": "model"}.get(e.field, e.field)
        return bad_request(field, str(e))


async def read_upload(request: Request, max_audio_bytes: int) -> FormData:
    """The multipart form, its body read in chunks and refused with 413 naming file past max_audio_bytes (and
    the little the other fields need); 400 for a body that is not a form."""
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise bad_request("file", f"the request body must be multipart/form-data with the audio in file, got "
                                  f"{content_type[:64]!r}")
    limit = max_audio_bytes + FORM_SLACK
    too_big = ApiError(413, f"file: the upload is larger than {max_audio_bytes} bytes (server.max_audio_bytes)",
                       "file", "request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    try:
        form = await Request(request.scope, _counted(request.receive, limit, too_big)).form(
            max_files=1, max_fields=MAX_FIELDS, max_part_size=FORM_SLACK)
    except (HTTPException, MultiPartException) as e:
        detail = e.detail if isinstance(e, HTTPException) else e.message
        raise bad_request("file", f"the request body is not a valid multipart form: {str(detail)[:200]}") from None
    except ClientDisconnect:
        raise ApiError(400, "the client closed the connection before sending the whole body") from None
    return form


def _counted(receive: Callable[[], Awaitable[MutableMapping[str, Any]]], limit: int,
             too_big: ApiError) -> Callable[[], Awaitable[MutableMapping[str, Any]]]:
    """receive, raising too_big once the body's bytes pass limit (before the parser takes them)."""
    seen = 0

    async def counted() -> MutableMapping[str, Any]:
        nonlocal seen
        message = await receive()
        seen += len(message.get("body", b""))
        if seen > limit:
            raise too_big
        return message
    return counted


async def read_transcription(form: FormData, task: str, max_audio_bytes: int) -> TranscriptionAsk:
    """The form's fields checked (400 naming the field, 413 naming file over max_audio_bytes)."""
    allowed = TRANSCRIPTION_FIELDS if task == "transcribe" else TRANSLATION_FIELDS
    for key in form.keys():
        if key not in allowed:
            known = key in TRANSCRIPTION_FIELDS
            raise bad_request(key[:64], f"{key[:64]} is not supported on /v1/audio/translations" if known
                              else f"{key[:64]}: unknown parameter", "unsupported_parameter" if known
                              else "unknown_parameter")
        if key not in _REPEATED and len(form.getlist(key)) > 1:
            raise bad_request(key, f"{key} is given more than once")
    audio = await _audio(form, max_audio_bytes)
    fmt = _text(form, "response_format") or "json"
    if fmt not in FORMATS:
        raise bad_request("response_format", f"response_format must be one of {', '.join(FORMATS)}, got {fmt!r}"
                          + (" (diarization is not supported by nvllm)" if fmt == "diarized_json" else ""),
                          "unsupported_parameter" if fmt == "diarized_json" else None)
    granularities = _granularities(form, fmt)
    stream = _flag(form, "stream")
    if stream and fmt not in ("json", "text"):
        raise bad_request("stream", f"stream sends transcript.text events: response_format must be json or text, "
                                    f"got {fmt}")
    _no_extras(form)
    temperature = _number(form, "temperature")
    try:
        params = TranscriptionParams.at_temperature(
            temperature, task=task, language=_text(form, "language") or None, prompt=_text(form, "prompt") or None,
            timestamps=fmt in TIMED or "segment" in granularities, seed=_seed(form))
    except InvalidParameter as e:
        raise bad_request(e.field, str(e)) from None
    keep_alive = None
    if _text(form, "keep_alive"):
        try:
            keep_alive = keep_alive_seconds(_text(form, "keep_alive"))
        except FieldError as e:
            raise bad_request(e.field, e.message) from None
    return TranscriptionAsk(audio, params, _text(form, "model") or None, fmt, stream, _priority(form), keep_alive)


async def _audio(form: FormData, max_audio_bytes: int) -> bytes:
    upload = form.get("file")
    if upload is None:
        raise bad_request("file", "file is required: the audio (WAV, FLAC, OGG, MP3) as a multipart file")
    if not isinstance(upload, UploadFile):
        raise bad_request("file", "file must be a file part of the form (the audio's bytes), not a text field")
    data = await upload.read(max_audio_bytes + 1)
    if len(data) > max_audio_bytes:
        raise ApiError(413, f"file: the upload is larger than {max_audio_bytes} bytes (server.max_audio_bytes)",
                       "file", "request_too_large")
    if not data:
        raise bad_request("file", "file: the upload is empty")
    return data


def _text(form: FormData, key: str) -> str:
    value = form.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise bad_request(key, f"{key} must be a text field, not a file")
    return value


def _flag(form: FormData, key: str) -> bool:
    value = _text(form, key).lower()
    if value not in TRUE + FALSE + ("",):
        raise bad_request(key, f"{key} must be true or false, got {value[:32]!r}")
    return value in TRUE


def _number(form: FormData, key: str) -> float | None:
    text = _text(form, key)
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise bad_request(key, f"{key} must be a number, got {text[:32]!r}") from None
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise bad_request(key, f"{key} must be a number from 0 to 1, got {text[:32]}")
    return value


def _seed(form: FormData) -> int | None:
    text = _text(form, "seed")
    try:
        seed = int(text) if text else None
    except ValueError:
        raise bad_request("seed", f"seed must be an integer, got {text[:32]!r}") from None
    if seed is not None and not 0 <= seed < 2**63:
        raise bad_request("seed", f"seed must be in [0, 2**63), got {text[:32]}")
    return seed


def _priority(form: FormData) -> int:
    text = _text(form, "priority")
    try:
        return int(text) if text else 0
    except ValueError:
        raise bad_request("priority", f"priority must be an integer, got {text[:32]!r}") from None


def _granularities(form: FormData, fmt: str) -> list[str]:
    values = [*form.getlist("timestamp_granularities[]"), *form.getlist("timestamp_granularities")]
    for v in values:
        if v == "word":
            raise bad_request("timestamp_granularities", "word timestamps are not supported by nvllm (segment "
                              "timestamps are: timestamp_granularities[]=segment)", "unsupported_parameter")
        if v != "segment":
            raise bad_request("timestamp_granularities", f"timestamp_granularities must hold segment, got {v!r}"[:200])
    if values and fmt != "verbose_json":
        raise bad_request("timestamp_granularities", "timestamp_granularities needs response_format verbose_json")
    return [str(v) for v in values]


def _no_extras(form: FormData) -> None:
    """OpenAI's fields nvllm does not do, refused unless they ask for nothing."""
    for v in [*form.getlist("include[]"), *form.getlist("include")]:
        raise bad_request("include", f"include {str(v)[:32]!r} is not supported by nvllm (no logprobs of a "
                                     "transcription)", "unsupported_parameter")
    strategy = _text(form, "chunking_strategy")
    if strategy not in ("", "auto"):
        raise bad_request("chunking_strategy", "chunking_strategy other than auto is not supported by nvllm "
                                               "(Whisper's 30-second windows)", "unsupported_parameter")
