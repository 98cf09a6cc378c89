"""A step's scheduled tokens packed into the model's ForwardBatch: token ids, positions, and per group of layers
a slot mapping and block tables, with the logits rows to sample. A sequence with proposed tokens is one
decode row per token it verifies, all on its block table."""

from __future__ import annotations

import numpy as np

from nvllm.engine.sampling_rows import Row
from nvllm.engine.scheduler import ScheduledBatch
from nvllm.model.decoder import ForwardBatch


def pack(batch: ScheduledBatch, bs: int, G: int) -> tuple[ForwardBatch, list[Row]]:
    """(the model's batch, the sampler's rows) for a scheduled batch, pages of bs tokens in G groups."""
    ids: list = []
    pos: list[np.ndarray] = []
    slots: list[list[np.ndarray]] = [[] for _ in range(G)]
    tables: list[list[np.ndarray]] = [[] for _ in range(G)]
    qlens: list[int] = []
    clens: list[int] = []
    logit_rows: list[int] = []
    rows: list[Row] = []
    typed = any(s.token_types is not None for s in batch.seqs)   # an encoder's pairs: token type ids
    types: list[list[int]] = []
    t = 0
    for seq, n in zip(batch.seqs, batch.num_new_tokens):
        start = seq.num_computed_tokens
        p = np.arange(start, start + n)                                  # [n]
        seq_tables = [np.asarray(tb, dtype=np.int64) for tb in seq.block_tables]
        drafts = seq.draft_tokens
        for g, table in enumerate(seq_tables):
            slots[g].append(table[p // bs] * bs + p % bs)
        pos.append(p)
        if drafts:
            ids.append([seq.token_ids[-1], *drafts])
            qlens.extend([1] * n)
            clens.extend(range(start + 1, start + n + 1))
            for g, table in enumerate(seq_tables):
                tables[g].extend([table] * n)
            logit_rows.extend(range(t, t + n))
            rows.extend((seq, drafts[:j]) for j in range(n))
            t += n
            continue
        ids.append(seq.token_ids[start:start + n])
        if typed:
            types.append(seq.token_types[start:start + n] if seq.token_types is not None else [0] * n)
        qlens.append(n)
        clens.append(start + n)
        for g, table in enumerate(seq_tables):
            tables[g].append(table)
        t += n
        if start + n == seq.num_tokens:   # the whole sequence is computed: sample its next token
            logit_rows.append(t - 1)
            rows.append((seq, []))
    width = max(len(tb) for tb in tables[0])
    block_tables = [np.zeros((len(tables[0]), width), dtype=np.int32) for _ in range(G)]   # [S, max_blocks]
    for group, rows_of in zip(block_tables, tables):
        for r, tb in enumerate(rows_of):
            group[r, :len(tb)] = tb
    i64 = lambda vals: np.asarray(vals, dtype=np.int64)  # noqa: E731
    fb = ForwardBatch.build(np.fromiter((x for chunk in ids for x in chunk), dtype=np.int64, count=t),
                            np.concatenate(pos), [np.concatenate(s) for s in slots], i64(qlens), i64(clens),
                            block_tables, i64(logit_rows))
    if typed:
        fb.token_types = np.fromiter((x for chunk in types for x in chunk), dtype=np.int64, count=t)
    return fb, rows
