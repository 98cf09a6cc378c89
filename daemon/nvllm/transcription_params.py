"""TranscriptionParams: what a transcription request (speech to text, OpenAI's /v1/audio/transcriptions and
/translations, gRPC's Transcribe) may ask of the speech model's decoding, validated once. Names follow OpenAI's
API where it has one, and Whisper's own decoding options (its transcribe()) for the rest, with their defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nvllm.sampling_params import InvalidParameter

# Whisper's temperature fallback: a window decoded greedily is decoded again at the next temperature while
# its text repeats itself (compression ratio) or the model is unsure of it (average logprob).
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
TASKS = ("transcribe", "translate")
MAX_PROMPT_CHARS = 4096   # the decoder keeps the last 223 tokens of it anyway


@dataclass(frozen=True)
class TranscriptionParams:
    task: str = "transcribe"               # "translate": into English, on multilingual models
    language: str | None = None            # an ISO 639-1 code ("en"); None: detected (multilingual models)
    prompt: str | None = None              # text the first window is conditioned on (names, spelling, style)
    temperature: tuple[float, ...] = FALLBACK_TEMPERATURES   # one value given: that alone, no fallback
    timestamps: bool = False               # segments' times decoded (verbose_json, srt and vtt need them)
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    condition_on_previous_text: bool = True
    seed: int | None = None                # the sampling seed of windows decoded at a temperature above 0

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise InvalidParameter("task", self.task, f"one of {', '.join(TASKS)}")
        if self.language is not None and (not isinstance(self.language, str) or not 2 <= len(self.language) <= 8):
            raise InvalidParameter("language", self.language, "a language code such as 'en'")
        if self.prompt is not None:
            if not isinstance(self.prompt, str):
                raise InvalidParameter("prompt", self.prompt, "a string")
            if len(self.prompt) > MAX_PROMPT_CHARS:
                raise InvalidParameter("prompt", self.prompt, f"at most {MAX_PROMPT_CHARS} characters")
        temps = self.temperature
        if not isinstance(temps, tuple) or not temps or any(
                isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 <= t <= 1
                for t in temps):
            raise InvalidParameter("temperature", temps, "a number from 0 to 1 (or a rising list of them)")
        for name in ("compression_ratio_threshold", "logprob_threshold", "no_speech_threshold"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise InvalidParameter(name, value, "a finite number")

    @classmethod
    def at_temperature(cls, temperature: float | None, **kwargs: object) -> TranscriptionParams:
        """OpenAI's single `temperature`: 0 (or none) keeps Whisper's fallback from 0, as OpenAI's does; a value
        above 0 decodes at that temperature alone."""
        if temperature is None or temperature == 0:
            return cls(**kwargs)  # type: ignore[arg-type]
        return cls(temperature=(temperature,), **kwargs)  # type: ignore[arg-type]
