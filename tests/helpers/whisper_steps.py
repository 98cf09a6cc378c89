"""Driving Whisper's decoder as the engine will: prompts fed in steps of prefill chunks and decode rows of several
sequences in one packed batch, each sequence's pages scattered over the pool and its own window's CrossKV; and
the plain greedy loop (argmax after the generation config's suppress lists) that transformers' generate runs
with num_beams=1 and no timestamps."""

from __future__ import annotations

import numpy as np

from nvllm.model.decoder import ForwardBatch
from nvllm.model.quant.kv_format import F32, KVFormat
from nvllm.model.whisper import Whisper
from nvllm.model.whisper_cross import CrossKV


def run_steps(model: Whisper, crosses: list[CrossKV], prompts: list[np.ndarray], steps: list[list[int]],
              block_size: int = 16, fmt: KVFormat = F32) -> list[np.ndarray]:
    """steps[k][i]: tokens of prompt i fed in step k (0: none). Returns each prompt's logits at every position."""
    total = sum(-(-len(p) // block_size) for p in prompts)
    cache = model.make_kv_cache(total + 1, block_size, fmt)
    order = np.random.default_rng(0).permutation(total + 1)[:total]
    tables, start = [], 0
    for p in prompts:
        n = -(-len(p) // block_size)
        tables.append(order[start:start + n])
        start += n
    width = max(len(t) for t in tables)
    done = [0] * len(prompts)
    logits: list[list[np.ndarray]] = [[] for _ in prompts]
    for step in steps:
        ids, pos, slots, rows, qlens, clens, who = [], [], [], [], [], [], []
        for i, n in enumerate(step):
            if n == 0:
                continue
            p = np.arange(done[i], done[i] + n)
            ids.append(prompts[i][p])
            pos.append(p)
            slots.append(tables[i][p // block_size] * block_size + p % block_size)
            row = np.zeros(width, np.int32)
            row[:len(tables[i])] = tables[i]
            rows.append(row)
            qlens.append(n)
            clens.append(done[i] + n)
            who.append((i, n))
            done[i] += n
        batch = ForwardBatch.build(np.concatenate(ids), np.concatenate(pos), np.concatenate(slots), np.array(qlens),
                                   np.array(clens), np.stack(rows), np.arange(sum(qlens)))
        out = model.forward(batch, cache, [crosses[i] for i, _ in who])
        at = 0
        for i, n in who:
            logits[i].append(out[at:at + n])
            at += n
    assert done == [len(p) for p in prompts]
    return [np.concatenate(chunks) for chunks in logits]


def greedy(model: Whisper, cross: CrossKV, prompt: list[int], max_new: int) -> list[int]:
    """The prompt prefilled, then one token a step: the argmax once the config's suppress_tokens (and, at the first
    step, begin_suppress_tokens) are masked; stops after <|endoftext|>."""
    c = model.config
    cache = model.make_kv_cache(-(-(len(prompt) + max_new) // 16) + 1, 16)
    table = np.arange(cache.num_blocks, dtype=np.int32)[None]
    ids, done, out = list(prompt), 0, []
    for step in range(max_new):
        pos = np.arange(done, len(ids))
        batch = ForwardBatch.build(np.array(ids[done:]), pos, pos.copy(), np.array([pos.size]), np.array([len(ids)]),
                                   table, np.array([pos.size - 1]))
        row = model.forward(batch, cache, [cross])[0]
        row[list(c.suppress_tokens)] = -np.inf
        if step == 0:
            row[list(c.begin_suppress_tokens)] = -np.inf
        done = len(ids)
        token = int(row.argmax())
        ids.append(token)
        out.append(token)
        if token == c.eos_token_id:
            break
    return out
