"""A transcription through the one way in, for every front door (HTTP's /v1/audio/transcriptions and
/translations, gRPC's Transcribe, the voice query): the upload's bytes and TranscriptionParams as one engine
request through DaemonState.submit, so leasing the speech model, admission, priorities, the watchdog, the
metrics and the cleanup are as for any request. server/ never decodes audio: the engine does, off the event
loop, and refuses what is not audio with InvalidParameter naming file (a model that does not transcribe:
naming model). What its outputs add up to is a `Transcript`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from nvllm.engine.outputs import RequestOutput, Segment
from nvllm.sampling_params import InvalidParameter
from nvllm.server.reading import Reading, Served
from nvllm.server.state import DaemonState
from nvllm.server.submission import Submission
from nvllm.transcription_params import TranscriptionParams

log = logging.getLogger("nvllm.server.transcription")


class TranscriptionFailed(Exception):
    """The engine failed the transcription, or aborted it (`aborted`: the daemon is stopping)."""

    def __init__(self, message: str, aborted: bool) -> None:
        super().__init__(message)
        self.aborted = aborted


@dataclass
class Transcript:
    """A transcription's outputs added up: its text (Whisper's starts with a space; dropped here, so the deltas a
    stream sends add up to the text), its segments, and from the last output the language and the audio's
    length."""
    text: str = ""
    segments: list[Segment] = field(default_factory=list)
    language: str | None = None
    seconds: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finished: bool = False

    def add(self, out: RequestOutput) -> str:
        """Take one output; returns the text it adds. TranscriptionFailed for a failed or aborted one."""
        if out.error is not None:
            log.error("failed in the engine: %s", out.error)
            raise TranscriptionFailed(f"the transcription failed: {out.error}", aborted=False)
        if out.finished and out.finish_reason == "abort":
            raise TranscriptionFailed("the request was aborted: the daemon is shutting down", aborted=True)
        delta = out.text if self.text else out.text.lstrip()
        self.text += delta
        self.segments += out.segments or []
        if out.finished:
            self.finished = True
            self.language, self.seconds = out.language, out.audio_seconds
            self.prompt_tokens, self.completion_tokens = out.prompt_tokens, out.completion_tokens
        return delta

    @property
    def heard(self) -> str:
        """The whole text, as a response gives it."""
        return self.text.strip()


async def submit_transcription(state: DaemonState, api: str, client: str, request_id: str, audio: bytes,
                               params: TranscriptionParams, model: str | None, arrival: float,
                               refusal: Callable[[InvalidParameter], Exception], priority: int = 0,
                               keep_alive_s: float | None = None) -> Submission:
    """The audio as one engine request to the named model; raises what submit raises (Refused, UnknownModel,
    EngineDead), and the engine's InvalidParameter as `refusal` makes it (naming the front door's field)."""
    def read(served: Served) -> Reading:
        return Reading([({"audio": audio}, params)], refusal, priority, f", {len(audio)} bytes of audio",
                       keep_alive_s)
    return await state.submit(api, client, request_id, read, arrival=arrival, model=model)


async def transcribe(state: DaemonState, api: str, client: str, request_id: str, audio: bytes,
                     params: TranscriptionParams, model: str | None, arrival: float,
                     refusal: Callable[[InvalidParameter], Exception], priority: int = 0) -> Transcript:
    """The whole transcript; raises what submit_transcription raises and TranscriptionFailed."""
    sub = await submit_transcription(state, api, client, request_id, audio, params, model, arrival, refusal,
                                     priority)
    transcript = Transcript()
    async with sub, contextlib.aclosing(aiter(sub)) as outputs:
        async for _, out in outputs:
            transcript.add(out)
    log.info("transcribed: %.1f s of audio, %d tokens", transcript.seconds or 0.0, transcript.completion_tokens)
    return transcript
