"""The voice query in one call: a chat whose messages carry audio is answered as the same chat with each clip's
transcript in the clip's place, so the answer is the one the transcript sent as text gets.

Each clip is one transcription through DaemonState.submit (the first submit) to the served speech model
(server.speech_model, or the only one: models/speech_slot.py), all of a request's clips at once, decoded
greedily with Whisper's fallback (seeded by the chat's seed, where it has one) and no prompt; then the front
door puts the transcripts in and submits the chat as any chat (the second submit), which streams as any chat
does. What was heard (`Heard`) goes back on
the answer, in each front door's shape. A clip the engine refuses is refused naming the clip's own field.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from nvllm.sampling_params import InvalidParameter
from nvllm.server.models.speech_slot import NoSpeechModel
from nvllm.server.state import DaemonState
from nvllm.server.transcribing import transcribe
from nvllm.transcription_params import TranscriptionParams


@dataclass(frozen=True)
class Clip:
    """A chat's audio: its bytes, and where it was (the front door's name of its field, its message's index
    and, over HTTP, its content part's)."""
    audio: bytes
    field: str
    message: int
    part: int | None = None


@dataclass(frozen=True)
class Heard:
    """A clip transcribed: its transcript, the language spoken and the clip's length in seconds."""
    clip: Clip
    text: str
    language: str | None
    seconds: float | None


class VoiceRefused(Exception):
    """A clip refused (its field named: not audio, too long, ...) or no speech model to hear it (model)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


async def hear(state: DaemonState, api: str, client: str, request_id: str, clips: Sequence[Clip],
               arrival: float, priority: int = 0, seed: int | None = None) -> list[Heard]:
    """Every clip transcribed, in order. Raises VoiceRefused, and what a transcription raises (Refused,
    UnknownModel, EngineDead, TranscriptionFailed); one failing cancels the others. seed: the chat's, which
    seeds a window decoded again hotter (Whisper's fallback), so a seeded voice query hears the same each time."""
    if not clips:
        return []
    try:
        speech = await state.speech.model(state.models)
    except NoSpeechModel as e:
        state.metrics.request(api, arrival=arrival).refused("invalid")
        raise VoiceRefused("model", f"{e} (the chat carries audio)") from None

    async def one(k: int, clip: Clip) -> Heard:
        def refusal(e: InvalidParameter) -> VoiceRefused:
            if e.field != "file":     # the speech model's own refusal (it does not transcribe): model
                return VoiceRefused("model", f"the speech model {speech!r} refused the audio: {e}")
            text = str(e)
            return VoiceRefused(clip.field, clip.field + text[len("file"):] if text.startswith("file")
                                else f"{clip.field}: {text}")
        t = await transcribe(state, api, client, f"{request_id}-audio{k}", clip.audio, TranscriptionParams(seed=seed),
                             speech, arrival, refusal, priority)
        return Heard(clip, t.heard, t.language, t.seconds)

    tasks = [asyncio.ensure_future(one(k, c)) for k, c in enumerate(clips)]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
