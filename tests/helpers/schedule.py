"""Feeding prompts to a Model step by step, as the engine packs them: prefill chunks and decode tokens of
several sequences in one batch, each sequence's pages scattered over the pool."""

from __future__ import annotations

import numpy as np

from nvllm.model.decoder import ForwardBatch, Model
from nvllm.model.quant.kv_format import F32, KVFormat


def run_schedule(model: Model, prompts: list[np.ndarray], steps: list[list[int]],
                 block_size: int = 16, fmt: KVFormat = F32) -> list[np.ndarray]:
    """Feed the prompts to the model in steps; steps[k][i] = tokens of prompt i in step k (0 = none).

    Each prompt's pages are scattered over the pool in a shuffled order, so block tables matter; a model
    whose pool has groups of layers (model/kv_layout.py) gets a table per group, each of other pages. fmt:
    the pool's KV format. Returns each prompt's logits at every position.
    """
    G = model.kv_layout.num_groups
    total = G * sum(-(-len(p) // block_size) for p in prompts)
    cache = model.make_kv_cache(total + 1, block_size, fmt)
    order = np.random.default_rng(0).permutation(total + 1)[:total]
    tables: list[list[np.ndarray]] = [[] for _ in range(G)]   # [group][prompt]
    start = 0
    for g in range(G):
        for p in prompts:
            n = -(-len(p) // block_size)
            tables[g].append(order[start:start + n])
            start += n
    width = max(len(t) for t in tables[0])
    done = [0] * len(prompts)
    logits: list[list[np.ndarray]] = [[] for _ in prompts]
    for step in steps:
        ids, pos, qlens, clens, who = [], [], [], [], []
        slots: list[list[np.ndarray]] = [[] for _ in range(G)]
        rows: list[list[np.ndarray]] = [[] for _ in range(G)]
        for i, n in enumerate(step):
            if n == 0:
                continue
            p = np.arange(done[i], done[i] + n)
            ids.append(prompts[i][p])
            pos.append(p)
            for g in range(G):
                slots[g].append(tables[g][i][p // block_size] * block_size + p % block_size)
                rows[g].append(np.zeros(width, dtype=np.int32))
                rows[g][-1][:len(tables[g][i])] = tables[g][i]
            qlens.append(n)
            clens.append(done[i] + n)
            who.append((i, n))
            done[i] += n
        fb = ForwardBatch.build(np.concatenate(ids), np.concatenate(pos), [np.concatenate(s) for s in slots],
                                np.array(qlens), np.array(clens), [np.stack(r) for r in rows], np.arange(sum(qlens)))
        out = model.forward(fb, cache)
        at = 0
        for i, n in who:
            logits[i].append(out[at:at + n])
            at += n
    assert done == [len(p) for p in prompts]
    return [np.concatenate(chunks) for chunks in logits]

