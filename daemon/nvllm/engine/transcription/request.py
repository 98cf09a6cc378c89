"""A transcription request checked against the speech model that serves it and made into its first window's
sequence: the upload's bytes decoded (audio/, off the engine thread, as a prompt is tokenized), Whisper's log-mel
features, the language and task checked, the prompt tokenized."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from nvllm.audio.clip import SAMPLE_RATE, AudioError, decode
from nvllm.audio.features import CHUNK_SAMPLES, HOP, log_mel
from nvllm.engine.sequence import Sequence
from nvllm.engine.transcription.tokens import WhisperTokens
from nvllm.engine.transcription.transcript import MAX_TEXT_CONTEXT, SAMPLE_LEN, Transcript
from nvllm.sampling_params import InvalidParameter, SamplingParams
from nvllm.text.detokenizer import IncrementalDetokenizer
from nvllm.text.tokenizer import Tokenizer
from nvllm.transcription_params import TranscriptionParams


def audio_of(prompt: Any) -> bytes:
    """The upload's bytes from a transcription's prompt, {"audio": bytes}."""
    if not isinstance(prompt, Mapping) or set(prompt) != {"audio"}:
        raise InvalidParameter("prompt", prompt, 'a transcription\'s {"audio": bytes}')
    data = prompt["audio"]
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidParameter("file", type(data).__name__, "the audio file's bytes")
    return bytes(data)


def features_of(samples: np.ndarray, n_mels: int) -> tuple[np.ndarray, int]:
    """(mel features, frames of audio): up to 30 s, one chunk padded as the reference feature extractor pads
    it; longer audio whole, with 30 s of silence after it (openai-whisper's long-form reading)."""
    frames = len(samples) // HOP
    if len(samples) <= CHUNK_SAMPLES:
        return log_mel(samples, n_mels, pad_to_chunk=True), max(frames, 1)
    padded = np.concatenate([samples, np.zeros(CHUNK_SAMPLES, np.float32)])
    return log_mel(padded, n_mels, pad_to_chunk=False), frames


def transcription_sequence(request_id: str, prompt: Any, params: TranscriptionParams, tokenizer: Tokenizer,
                           tokens: WhisperTokens, n_mels: int, max_seconds: float | None, seed: int,
                           priority: int) -> Sequence:
    """The request's first window as a Sequence (its Transcript on `transcript`); InvalidParameter naming the
    field (file, language, task, prompt) for what cannot be transcribed."""
    if params.task == "translate" and not tokens.multilingual:
        raise InvalidParameter("model", "translate", "a multilingual speech model for translation (this one knows "
                               "English only)", message="model: this speech model knows English only; translation "
                               "needs a multilingual one")
    language = tokens.language(params.language)
    data = audio_of(prompt)
    try:
        samples = decode(data, max_seconds)
    except AudioError as e:
        raise InvalidParameter("file", f"{len(data)} bytes", str(e), message=str(e)) from None
    features, frames = features_of(samples, n_mels)
    prompt_ids = tokenizer.encode(" " + params.prompt.strip(), add_special_tokens=False) if params.prompt else []
    transcript = Transcript(features, frames, params, tokens, language, prompt_ids,
                            lambda ids: tokenizer.decode(ids, skip_special_tokens=True), len(samples) / SAMPLE_RATE)
    first = transcript.window_prompt()
    seq = Sequence(request_id, first, window_params(first), IncrementalDetokenizer(tokenizer, first), frozenset(),
                   seed, priority)
    seq.transcript = transcript
    return seq


def window_params(prompt: list[int]) -> SamplingParams:
    """What the scheduler and the stops read of a window's sequence: the tokens it may add (its forced ones and
    SAMPLE_LEN sampled, within the decoder's positions). The window's decoding itself is Transcript's."""
    room = min(SAMPLE_LEN + 4, MAX_TEXT_CONTEXT - len(prompt))
    return SamplingParams(max_tokens=room, temperature=0.0).resolve({}, max_model_len=MAX_TEXT_CONTEXT)
