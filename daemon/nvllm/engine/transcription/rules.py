"""Whisper's decoding rules on one row of logits, before the token is chosen (openai-whisper's logit filters,
which transformers' Whisper logits processors follow): tokens never sampled, a window's first token neither a
space nor the end, and with timestamps their grammar: they come in pairs that close one segment and open the
next, never go back, open the window within its first second, and win outright when the model puts more
probability on them all than on any one text token."""

from __future__ import annotations

import numpy as np

from nvllm.engine.transcription.tokens import WhisperTokens

MAX_INITIAL_TIMESTAMP = 50    # a window's first timestamp is at most <|1.00|> (openai-whisper's max_initial_timestamp)
NEG_INF = np.float32(-np.inf)


def apply_rules(logits: np.ndarray, t: WhisperTokens, sampled: list[int], timestamps: bool) -> None:
    """In place on one row [V]: `sampled` are the window's tokens after its forced prefix, so far."""
    if t.suppress:
        logits[list(t.suppress)] = NEG_INF
    if not sampled and t.begin_suppress:
        logits[list(t.begin_suppress)] = NEG_INF
    if not timestamps:
        return
    logits[t.no_timestamps] = NEG_INF
    begin = t.timestamp_begin
    last = len(sampled) >= 1 and sampled[-1] >= begin
    penultimate = len(sampled) < 2 or sampled[-2] >= begin
    if last:
        if penultimate:    # a pair just closed a segment: text must follow
            logits[begin:] = NEG_INF
        else:              # a segment's text ended on a timestamp: another (or the end) must follow
            logits[:t.eot] = NEG_INF
    stamps = [s for s in sampled if s >= begin]
    if stamps:   # never back in time, and a segment never empty (the same timestamp twice only to close)
        floor = stamps[-1] if last and not penultimate else stamps[-1] + 1
        logits[begin:floor] = NEG_INF
    if not sampled:   # the window opens on a timestamp within its first second
        logits[:begin] = NEG_INF
        logits[begin + MAX_INITIAL_TIMESTAMP + 1:] = NEG_INF
    logprobs = log_softmax(logits)
    timestamp_mass = np.logaddexp.reduce(logprobs[begin:])
    if timestamp_mass > logprobs[:begin].max():
        logits[:begin] = NEG_INF


def log_softmax(row: np.ndarray) -> np.ndarray:
    top = row.max()
    shifted = row - top
    return shifted - np.log(np.exp(shifted).sum())


def choose(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """The token of a filtered row: the most likely at temperature 0, else drawn from softmax(logits / T)."""
    if temperature <= 0:
        return int(np.argmax(logits))
    p = np.exp((log_softmax(logits) / np.float32(temperature)).astype(np.float64))
    p /= p.sum()
    return int(rng.choice(p.size, p=p))
