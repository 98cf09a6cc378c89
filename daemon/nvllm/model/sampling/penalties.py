"""Banned tokens, repetition, frequency and presence penalties, applied to a whole batch of logits at once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from nvllm.model.sampling.batch import SamplingBatch

_F32 = np.float32


def _flat_index(rows: np.ndarray, per_row: Sequence[np.ndarray | None] | Mapping[int, np.ndarray],
                vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions row*V + token of every token listed for the given rows, and each one's row."""
    arrays = [np.asarray(per_row[i], dtype=np.int64).reshape(-1) for i in rows]
    lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    if not lengths.sum():
        return np.empty(0, np.int64), np.empty(0, np.int64)
    toks = np.concatenate(arrays)
    if toks.min() < 0 or toks.max() >= vocab:  # would otherwise land in a neighbouring row
        raise ValueError(f"token id out of range [0, {vocab}) in the sampling batch")
    row_of = np.repeat(rows, lengths)
    return row_of * vocab + toks, row_of


def apply(logits: np.ndarray, batch: SamplingBatch, owned: bool = False) -> tuple[np.ndarray, bool]:
    """Bans, then repetition, then frequency/presence penalties; copies the logits only if needed (never
    when the caller says it owns them already).

    Returns the logits to sample from and whether they are a copy this call (or the caller) owns."""
    n, vocab = logits.shape
    ban = np.array([b is not None and len(b) > 0 for b in batch.banned_token_ids], dtype=bool)
    rep = batch.repetition_penalty != 1.0
    fp = (batch.frequency_penalty != 0.0) | (batch.presence_penalty != 0.0)
    if not (ban.any() or rep.any() or fp.any()):
        return logits, owned
    x = logits if owned else np.array(logits, dtype=_F32, order="C", copy=True)
    xf = x.reshape(-1)  # view: [N, V] -> [N*V]
    if ban.any():
        idx, _ = _flat_index(np.flatnonzero(ban), batch.banned_token_ids, vocab)
        xf[idx] = -np.inf
    if rep.any():
        rows = np.flatnonzero(rep)
        seen = {int(i): np.concatenate((np.asarray(batch.prompt_token_ids[i], np.int64).reshape(-1),
                                        np.asarray(batch.output_token_ids[i], np.int64).reshape(-1)))
                for i in rows}  # prompt + output tokens per row
        idx, row_of = _flat_index(rows, seen, vocab)
        # Duplicate positions all read the original value and write the same result: idempotent.
        vals = xf[idx]
        pen = batch.repetition_penalty[row_of]
        xf[idx] = np.where(vals > 0, vals / pen, vals * pen)
    if fp.any():
        idx, _ = _flat_index(np.flatnonzero(fp), batch.output_token_ids, vocab)
        pos, counts = np.unique(idx, return_counts=True)
        row_of = pos // vocab
        xf[pos] -= batch.frequency_penalty[row_of] * counts.astype(_F32) + batch.presence_penalty[row_of]
    return x, True
