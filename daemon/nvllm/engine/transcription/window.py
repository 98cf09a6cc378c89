"""What a decoded window of 30 s gives (openai-whisper's transcribe() loop, one window): its quality (average
logprob, compression ratio, no-speech probability) and whether to decode it again at the next temperature, its
segments (split at timestamp pairs), and how far the audio's reading moves on (seek)."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from nvllm.engine.outputs import Segment
from nvllm.engine.transcription.tokens import SECONDS_PER_TIMESTAMP, WhisperTokens
from nvllm.transcription_params import TranscriptionParams

FRAMES_PER_WINDOW = 3000     # 30 s of 10-ms mel frames
SECONDS_PER_FRAME = 0.01
FRAMES_PER_TIMESTAMP = 2     # the encoder halves the frames: one timestamp step is two mel frames
DecodeFn = Callable[[list[int]], str]   # token ids to text (the tokenizer's decode, specials skipped)


@dataclass
class Decoded:
    """One decoding of a window: its sampled tokens (timestamps included, the end not) and their logprobs."""
    temperature: float
    tokens: list[int] = field(default_factory=list)
    sum_logprob: float = 0.0
    no_speech_prob: float = 0.0
    ended: bool = False          # the model ended it (<|endoftext|>), rather than the length

    @property
    def avg_logprob(self) -> float:
        return self.sum_logprob / (len(self.tokens) + 1)


def compression_ratio(text: str) -> float:
    """How much the text repeats itself: its UTF-8 bytes over their zlib size (above 2.4: a loop)."""
    data = text.encode()
    return len(data) / len(zlib.compress(data)) if data else 0.0


def needs_fallback(d: Decoded, text: str, p: TranscriptionParams) -> bool:
    """Whether to decode the window again, hotter: its text loops or the model is unsure of it, unless the
    window is silence (then it is skipped, not decoded again)."""
    if p.no_speech_threshold is not None and d.no_speech_prob > p.no_speech_threshold and \
            p.logprob_threshold is not None and d.avg_logprob < p.logprob_threshold:
        return False
    if p.compression_ratio_threshold is not None and compression_ratio(text) > p.compression_ratio_threshold:
        return True
    return p.logprob_threshold is not None and d.avg_logprob < p.logprob_threshold


def is_silence(d: Decoded, p: TranscriptionParams) -> bool:
    """The window holds no speech: the model says so at its start and is unsure of what it decoded."""
    if p.no_speech_threshold is None or d.no_speech_prob <= p.no_speech_threshold:
        return False
    return p.logprob_threshold is None or d.avg_logprob < p.logprob_threshold


def segments_of(d: Decoded, seek: int, window_frames: int, t: WhisperTokens, decode: DecodeFn,
                first_id: int, text_ratio: float) -> tuple[list[Segment], int]:
    """(the window's segments, the frames the reading moves on): at each pair of timestamps a segment ends and
    the next begins; a window ending on a single timestamp is read whole, else the reading resumes at its last
    timestamp (the speech after it was cut by the window's end and is decoded again in the next)."""
    begin = t.timestamp_begin
    tokens = d.tokens
    offset = seek * SECONDS_PER_FRAME
    is_stamp = [tok >= begin for tok in tokens]
    pairs = [i for i in range(1, len(tokens)) if is_stamp[i] and is_stamp[i - 1]]
    single_ending = is_stamp[-2:] == [False, True]
    out: list[Segment] = []

    def add(start: float, end: float, toks: list[int]) -> None:
        text = decode([x for x in toks if x < t.eot])
        if not text.strip() or end <= start:   # an empty or instantaneous segment says nothing
            return
        out.append(Segment(first_id + len(out), seek, round(start, 3), round(end, 3), text, toks, d.temperature,
                           d.avg_logprob, text_ratio, d.no_speech_prob))

    if pairs:
        cuts = pairs + ([len(tokens)] if single_ending else [])
        last = 0
        for cut in cuts:
            piece = tokens[last:cut]
            add(offset + (piece[0] - begin) * SECONDS_PER_TIMESTAMP, offset + (piece[-1] - begin) *
                SECONDS_PER_TIMESTAMP, piece)
            last = cut
        moved = window_frames if single_ending else (tokens[last - 1] - begin) * FRAMES_PER_TIMESTAMP
        return out, moved
    duration = window_frames * SECONDS_PER_FRAME
    stamps = [tok for tok in tokens if tok >= begin]
    if stamps and stamps[-1] != begin:
        duration = (stamps[-1] - begin) * SECONDS_PER_TIMESTAMP
    add(offset, offset + duration, tokens)
    return out, window_frames
