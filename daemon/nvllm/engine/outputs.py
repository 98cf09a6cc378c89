"""What the engine hands back: each step's new text and tokens of a request, with their logprobs, and at the end
why it finished and what it used. Front doors read these; nothing else of the engine's request state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class TopLogprob(NamedTuple):
    token_id: int
    logprob: float
    token: str                     # the vocabulary entry, as the tokenizer spells it
    text: str = ""                 # the token decoded alone, as a client prints it (the HTTP API's "token")


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[TopLogprob] = field(default_factory=list)
    token: str = ""                # the chosen token's vocabulary entry and decoded text, as in TopLogprob
    text: str = ""


@dataclass
class Segment:
    """A stretch of a transcription: Whisper's segment, with its times in seconds from the audio's start and
    what its window's decoding said of it (Whisper's transcribe() fields, OpenAI's verbose_json)."""
    id: int
    seek: int                      # the window's first mel frame (10 ms each)
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float             # what its window was decoded at (above 0 after a fallback)
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float


@dataclass
class RequestOutput:
    """What one step added to one request; the last one has `finished` and the usage counts."""
    request_id: str
    text: str                      # new text since the previous output
    token_ids: list[int]           # new tokens since the previous output
    logprobs: list[TokenLogprob] | None
    finished: bool
    finish_reason: str | None      # "stop", "length" or "abort" once finished
    stop_reason: str | int | None  # the stop string or token id that matched
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    error: str | None = None       # set when the request failed inside the engine
    # On the output with its first tokens: seconds from the engine taking the request to its first step
    # (waiting for a seat, pages or budget), and from then to this output (prefill of what the prefix
    # cache did not hold, chunk by chunk, and the first token's sampling)
    queued_s: float | None = None
    prefill_s: float | None = None
    # A pooling request's result, on its one output: the embedding, or a cross-encoder's raw scores.
    pooled: list[float] | None = None
    # Prompt tokens a chat's context_overflow "drop_oldest" dropped (whole turns), on the finished output.
    dropped_prompt_tokens: int = 0
    # A transcription's segments as each ends (its text came before in `text`), its language (given or
    # detected) and the audio's length; None for other requests.
    segments: list[Segment] | None = None
    language: str | None = None
    audio_seconds: float | None = None
