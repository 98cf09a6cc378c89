"""The engine step's part for a speech model: each window's encoder run once, when its sequence is first
scheduled, and its cross-attention keys and values held on the sequence until the window ends; the decoder
steps of every transcription in the batch run together, each row's token chosen by Whisper's rules
(transcript.py); a decoded window is decoded again hotter, or accepted and the next one queued as the same
sequence with a new prompt (its pages given back meanwhile), or the transcription ends."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from nvllm.engine.outputs import RequestOutput
from nvllm.engine.sampling_rows import Row
from nvllm.engine.scheduler import Scheduler
from nvllm.engine.sequence import Sequence
from nvllm.engine.transcription.request import window_params
from nvllm.engine.transcription.tokens import WhisperTokens
from nvllm.engine.transcription.transcript import Transcript
from nvllm.model.decoder import ForwardBatch
from nvllm.model.kv_cache import KVCache


class Transcriber:
    def __init__(self, model: Any, scheduler: Scheduler) -> None:
        self.model = model
        self.num_mel_bins: int = model.config.num_mel_bins
        self.scheduler = scheduler
        self.num_windows = 0          # windows encoded (a fallback's decoding again reuses its window's)
        self.encode_seconds = 0.0

    @staticmethod
    def tokens_of(model: Any, tokenizer: Any) -> WhisperTokens:
        c = model.config
        return WhisperTokens.of(tokenizer, c.is_multilingual, c.suppress_tokens, c.begin_suppress_tokens)

    def run(self, seqs: list[Sequence], fb: ForwardBatch, rows: list[Row], kv_cache: KVCache
            ) -> list[tuple[Sequence, int | None]]:
        """Encode the windows that start this step, run the decoder, and choose each row's token: (sequence,
        its next token, or None where its window ended)."""
        for seq in seqs:
            tr = transcript(seq)
            if tr.cross is None:
                t0 = time.perf_counter()
                tr.cross = self.model.encode(tr.window_features())
                self.encode_seconds += time.perf_counter() - t0
                self.num_windows += 1
        logits = self.model.forward(fb, kv_cache, [transcript(s).cross for s in seqs])
        return [(seq, transcript(seq).next_token(np.asarray(logits[r]), seq.generator, seq.num_tokens))
                for r, (seq, _) in enumerate(rows)]

    def window_ended(self, seq: Sequence) -> tuple[bool, RequestOutput | None]:
        """After a window's last token: (whether the transcription goes on, the output of what it accepted)."""
        tr = transcript(seq)
        more = tr.end_window()
        segments = tr.take_segments()
        if more:   # the same sequence decodes the next window (or this one again), from a fresh prompt
            self.scheduler.finish(seq)
            prompt = tr.window_prompt()
            seq.restart(prompt, window_params(prompt))
            self.scheduler.add(seq)
        return more, (output(seq, segments, finished=False) if segments else None)


def transcript(seq: Sequence) -> Transcript:
    tr = seq.transcript
    assert isinstance(tr, Transcript)
    return tr


def output(seq: Sequence, segments: list, finished: bool) -> RequestOutput:
    """What a transcription hands back: the accepted segments' text and tokens, and at the end its language,
    the audio's length and the tokens decoded in all."""
    tr = transcript(seq)
    tr.num_decoded += sum(len(s.tokens) for s in segments)
    return RequestOutput(
        request_id=seq.request_id, text="".join(s.text for s in segments),
        token_ids=[t for s in segments for t in s.tokens], logprobs=None, finished=finished,
        finish_reason=seq.finish_reason if finished else None, stop_reason=None, prompt_tokens=tr.num_prompt_tokens,
        completion_tokens=tr.num_decoded, cached_tokens=0, error=seq.error, segments=segments,
        language=tr.language_code, audio_seconds=tr.audio_seconds)
