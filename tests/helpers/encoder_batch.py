"""A packed batch of whole sequences, as the engine's packing gives an encoder (model/encoder.py): every
sequence from position 0, no pages read."""
from __future__ import annotations

import numpy as np

from nvllm.model.attention import AttentionMetadata
from nvllm.model.decoder import ForwardBatch


def encoder_batch(seqs: list[list[int]], types: list[list[int]] | None = None) -> ForwardBatch:
    """seqs' token ids packed one after another; types: their token type ids (None: no token types, all 0)."""
    lens = np.array([len(s) for s in seqs], np.int64)
    positions = np.concatenate([np.arange(n) for n in lens]).astype(np.int64)
    meta = AttentionMetadata(slot_mapping=np.zeros(positions.size, np.int64), query_lens=lens, context_lens=lens,
                             block_tables=np.zeros((len(seqs), 1), np.int32), positions=positions)
    fb = ForwardBatch(np.concatenate(seqs).astype(np.int64), positions, meta, np.zeros(0, np.int64))
    if types is not None:
        fb.token_types = np.concatenate(types).astype(np.int64)
    return fb
