"""Speech on the daemon: which served model transcribes, and the limits on what it is sent.

The speech model is a served model like the others (a slot of model_set.py: loaded on first use, keep_alive,
unloaded least recently used first); this only says which one a voice query's audio, and a transcription that
names no model, go to: server.speech_model, else the only speech model served. A model is a speech model when
its files are a Whisper's (the factory's is_speech: its files looked at, nothing loaded); the answer is found
once, off the event loop, and kept. server.max_audio_bytes and server.max_audio_seconds ride along for the
front doors (the duration is the engine's to check, from the audio's header).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from nvllm.engine.assembly import factory
from nvllm.server.models.model_set import ModelSet


class NoSpeechModel(Exception):
    """Audio sent where no speech model is served, or several are and server.speech_model names none; the
    front doors refuse it naming model (HTTP 400, gRPC INVALID_ARGUMENT)."""


class SpeechSlot:
    def __init__(self, setting: str = "", max_audio_bytes: int = 25 << 20, max_audio_seconds: float = 600.0,
                 is_speech: Callable[[Path], bool] = factory.is_speech) -> None:
        """setting: server.speech_model (checked to be served when the daemon starts); is_speech: whether a
        model's path holds a speech model."""
        self.setting = setting
        self.max_audio_bytes = max_audio_bytes
        self.max_audio_seconds = max_audio_seconds
        self._is_speech = is_speech
        self._found: list[str] | None = None

    async def model(self, models: ModelSet | None) -> str:
        """The served speech model's name; NoSpeechModel when there is none, or several and no setting."""
        if self.setting:
            return self.setting
        if models is None:
            raise NoSpeechModel("no speech model is served")
        if self._found is None:    # the files of every model served looked at once, off the event loop
            specs = [slot.spec for slot in models.slots.values()]
            self._found = await asyncio.get_running_loop().run_in_executor(
                None, lambda: [s.name for s in specs if self._is_speech(s.settings.model_path())])
        if not self._found:
            raise NoSpeechModel("model: no speech model is served to transcribe audio (serve a Whisper model, "
                                "e.g. `nvllm models pull whisper-tiny.en`, beside the chat model)")
        if len(self._found) > 1:
            raise NoSpeechModel(f"model: several speech models are served ({', '.join(self._found)}): "
                                "name one in server.speech_model")
        return self._found[0]
