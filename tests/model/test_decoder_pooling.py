"""Decoder embedders and rerankers (model/decoder.py's Model.pool) against transformers' goldens: a
Qwen3-Embedding-style vector is the last token's final-normed state, normalized, so the logits transformers
gives at that position are the lm_head's product with it up to a positive scale; a Qwen3-Reranker-style score
is logit("yes") - logit("no") there. The tiny Qwen3 stands in (its golden: tests/golden/tiny-qwen3.safetensors)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from helpers.paths import ROOT
from nvllm.model.decoder import ForwardBatch, Model
from nvllm.model.pooler import Pooling

GOLDEN = ROOT / "tests" / "golden" / "tiny-qwen3.safetensors"


@pytest.fixture(scope="module")
def qwen3(tiny_models: dict[str, Path]) -> Model:
    return Model.from_dir(tiny_models["tiny-qwen3"])


def pooled(model: Model, seqs: list[np.ndarray]) -> list[np.ndarray]:
    """Model.pool over whole sequences packed into one batch, each on pages of its own."""
    bs, pages = 16, 0
    kv = model.make_kv_cache(64, bs)
    slots, tables = [], []
    for s in seqs:
        n = -(-len(s) // bs)
        tables.append(np.arange(pages, pages + n))
        slots.append(pages * bs + np.arange(len(s)))
        pages += n
    width = max(len(t) for t in tables)
    table = np.zeros((len(seqs), width), np.int32)
    for r, t in enumerate(tables):
        table[r, :len(t)] = t
    lens = np.array([len(s) for s in seqs], np.int64)
    fb = ForwardBatch.build(np.concatenate(seqs), np.concatenate([np.arange(n) for n in lens]), np.concatenate(slots),
                            lens, lens, table, np.cumsum(lens) - 1)
    return model.pool(fb, kv)


def test_the_embedding_is_the_last_tokens_final_state(qwen3: Model) -> None:
    g = load_file(str(GOLDEN))
    qwen3.pooling, qwen3.judge_tokens = Pooling("last"), None
    seqs = [g[f"batch_{i}_ids"] for i in range(4)]
    for v, i in zip(pooled(qwen3, seqs), range(4)):
        assert abs(float(np.linalg.norm(v)) - 1) < 1e-5
        logits = qwen3.weights.lm_head.apply(v[None].astype(np.float32))[0].astype(np.float64)
        want = g[f"batch_{i}_logits"][-1].astype(np.float64)
        assert logits @ want / np.linalg.norm(logits) / np.linalg.norm(want) >= 0.9999, i


def test_the_judgement_is_the_yes_logit_less_the_no_logit(qwen3: Model) -> None:
    g = load_file(str(GOLDEN))
    qwen3.pooling, qwen3.judge_tokens = None, (398, 497)   # any two ids stand in for "no" and "yes"
    seqs = [g[f"batch_{i}_ids"] for i in range(4)]
    for score, i in zip(pooled(qwen3, seqs), range(4)):
        last = g[f"batch_{i}_logits"][-1]
        assert score.shape == (1,) and abs(float(score[0]) - float(last[497] - last[398])) < 2e-3, i
