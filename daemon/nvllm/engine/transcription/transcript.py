"""A transcription's state over its windows, held on its Sequence: the audio's mel features, where the reading
is (seek), the window being decoded (its prompt, the tokens forced after <|startoftranscript|>, what was
sampled and at which temperature), the text so far that conditions the next window, and the segments not yet
handed out. The engine's step (transcriber.py) feeds it a row of logits at a time."""

from __future__ import annotations

from typing import Any

import numpy as np

from nvllm.engine.outputs import Segment
from nvllm.engine.transcription.rules import apply_rules, choose, log_softmax
from nvllm.engine.transcription.tokens import WhisperTokens
from nvllm.engine.transcription.window import (
    FRAMES_PER_WINDOW,
    Decoded,
    DecodeFn,
    compression_ratio,
    is_silence,
    needs_fallback,
    segments_of,
)
from nvllm.transcription_params import TranscriptionParams

MAX_TEXT_CONTEXT = 448   # the decoder's positions: a window's prompt and its tokens together
SAMPLE_LEN = MAX_TEXT_CONTEXT // 2   # tokens a window may sample (openai-whisper's sample_len)
PROMPT_KEEP = SAMPLE_LEN - 1         # previous text a window is conditioned on, at most


class Transcript:
    def __init__(self, features: np.ndarray, content_frames: int, params: TranscriptionParams, tokens: WhisperTokens,
                 language: int | None, prompt_ids: list[int], decode: DecodeFn, audio_seconds: float) -> None:
        self.features = features            # [n_mels, frames]: one padded 30-s chunk, or the whole audio
        self.content_frames = content_frames   # frames of actual audio (the rest is padding)
        self.params = params
        self.t = tokens
        self.language = language             # its token; None until detected (multilingual, no language given)
        self.decode = decode
        self.audio_seconds = audio_seconds
        self.seek = 0
        self.all_tokens = list(prompt_ids)   # the request's prompt, then every accepted window's tokens
        self.num_prompt_tokens = len(prompt_ids)
        self.num_decoded = 0                 # tokens of the segments handed out
        self.prompt_reset_since = 0
        self.num_segments = 0
        self.unsent: list[Segment] = []      # accepted, not yet in an output
        self.temperature_index = 0
        self.decoded = Decoded(self.temperatures[0])
        self.pending: list[int] | None = None   # forced tokens still to come; None before the window's first row
        self.cross: Any = None               # the window's cross-attention keys and values (model.encode's)
        self.done = False

    @property
    def temperatures(self) -> tuple[float, ...]:
        return self.params.temperature

    @property
    def window_frames(self) -> int:
        return min(FRAMES_PER_WINDOW, self.content_frames - self.seek)

    def window_features(self) -> np.ndarray:
        """[n_mels, 3000]: the window's frames, zero-padded past the audio's end (as openai-whisper pads)."""
        if self.features.shape[1] == FRAMES_PER_WINDOW and self.seek == 0:
            return self.features
        part = self.features[:, self.seek:self.seek + self.window_frames]
        out = np.zeros((self.features.shape[0], FRAMES_PER_WINDOW), np.float32)
        out[:, :part.shape[1]] = part
        return out

    def window_prompt(self) -> list[int]:
        """The window's decoder prompt: <|startofprev|> and the text it is conditioned on, then
        <|startoftranscript|>; the language, task and timestamp tokens follow as forced tokens."""
        previous = self.all_tokens[self.prompt_reset_since:][-PROMPT_KEEP:]
        return ([self.t.sot_prev, *previous] if previous else []) + [self.t.sot]

    def next_token(self, logits: np.ndarray, rng: np.random.Generator, length: int) -> int | None:
        """The token that follows, from the logits of the window's last position (`length` tokens so far);
        None when the window ends: the model's end, SAMPLE_LEN tokens sampled, or the decoder's positions full."""
        t, d = self.t, self.decoded
        if self.pending is None:   # the row at <|startoftranscript|>: no-speech and the language are read here
            if t.no_speech is not None:
                d.no_speech_prob = float(np.exp(log_softmax(logits)[t.no_speech]))
            if self.language is None and t.multilingual:
                ids = np.fromiter(t.languages.values(), np.int64)
                self.language = int(ids[int(np.argmax(logits[ids]))])
            self.pending = t.forced(self.language, self.params.task, self.params.timestamps)
        if self.pending:
            return self.pending.pop(0)
        row = logits.astype(np.float32, copy=True)
        apply_rules(row, t, d.tokens, self.params.timestamps)
        token = choose(row, d.temperature, rng)
        d.sum_logprob += float(log_softmax(row)[token])
        if token == t.eot:
            d.ended = True
            return None
        d.tokens.append(token)
        return None if len(d.tokens) >= SAMPLE_LEN or length + 1 >= MAX_TEXT_CONTEXT else token

    def end_window(self) -> bool:
        """The window is decoded: decode it again hotter, or accept it and move on. True while there is more to
        decode (the same window again, or the next), False when the transcription is done."""
        d, p = self.decoded, self.params
        text_tokens = [x for x in d.tokens if x < self.t.eot]
        text = self.decode(text_tokens)
        if needs_fallback(d, text, p) and self.temperature_index + 1 < len(self.temperatures):
            self.temperature_index += 1
            self._new_decoding()
            return True
        if is_silence(d, p):
            moved = self.window_frames
        else:
            segments, moved = segments_of(d, self.seek, self.window_frames, self.t, self.decode, self.num_segments,
                                          compression_ratio(text))
            self.num_segments += len(segments)
            self.unsent += segments
            self.all_tokens += d.tokens
            if not p.condition_on_previous_text or d.temperature > 0.5:
                self.prompt_reset_since = len(self.all_tokens)
        self.seek += max(moved, 1)
        self.temperature_index = 0
        self.cross = None
        self._new_decoding()
        self.done = self.seek >= self.content_frames
        return not self.done

    def _new_decoding(self) -> None:
        self.decoded = Decoded(self.temperatures[self.temperature_index])
        self.pending = None

    def take_segments(self) -> list[Segment]:
        out, self.unsent = self.unsent, []
        return out

    @property
    def language_code(self) -> str | None:
        return "en" if not self.t.multilingual else None if self.language is None else self.t.code(self.language)
