"""XLM-RoBERTa cross-encoders and NomicBert embedders through the engine, from their folders and from the GGUFs
llama.cpp's converter wrote (tests/golden/converted/): the factory reads each one's task, and a step of pooling
requests gives transformers' logits (tiny-xlmr-reranker: the query and document joined as <s> A </s></s> B
</s>) and embeddings (tiny-nomic-bert), every page back afterwards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from golden.pooling_cases import EMBED_TEXTS
from helpers.daemon_util import assert_pages_all_back
from helpers.engines import backed_engine
from helpers.paths import GOLDEN
from helpers.pooling_golden import golden_cases
from nvllm.config import load_settings
from nvllm.engine.llm_engine import LLMEngine
from nvllm.engine.prompt import Prompt
from nvllm.pooling_params import PoolingParams

CONVERTED = GOLDEN / "converted"


def engine(model: Path) -> LLMEngine:
    return backed_engine(load_settings(overrides={"model": {"path": str(model)}}))


def run(eng: LLMEngine, prompts: list[Prompt]) -> list[list[float]]:
    """Each prompt's vector, all of them added before the first step."""
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, PoolingParams())
    vectors: dict[str, list[float]] = {}
    while eng.has_unfinished():
        for o in eng.step():
            assert o.finished and o.error is None and o.pooled is not None
            vectors[o.request_id] = o.pooled
    assert_pages_all_back(eng)
    return [vectors[f"r{i}"] for i in range(len(prompts))]


@pytest.mark.parametrize("source", ["folder", "gguf"])
def test_an_xlmr_reranker_scores_as_transformers(tiny_encoders: dict[str, Path], source: str) -> None:
    model = tiny_encoders["tiny-xlmr-reranker"] if source == "folder" else CONVERTED / "tiny-xlmr-reranker.f32.gguf"
    eng = engine(model)
    assert eng.task == "rerank"
    cases = golden_cases("tiny-xlmr-reranker")
    scores = run(eng, [{"query": c["query"], "document": c["document"]} for c in cases])
    assert max(abs(s[0] - c["logit"]) for s, c in zip(scores, cases)) < 1e-5


@pytest.mark.parametrize("source", ["folder", "gguf"])
def test_a_nomic_embedder_embeds_as_transformers(tiny_encoders: dict[str, Path], source: str) -> None:
    model = tiny_encoders["tiny-nomic-bert"] if source == "folder" else CONVERTED / "tiny-nomic-bert.f32.gguf"
    eng = engine(model)
    assert eng.task == "embed"
    golden = {c["text"]: c["embedding"] for c in golden_cases("tiny-nomic-bert") if c["kind"] == "text"}
    texts = list(EMBED_TEXTS[:6])   # the GGUF's WordPiece splits EMBED_TEXTS[6]'s 120-letter word, as llama.cpp
    for v, text in zip(run(eng, list(texts)), texts):
        assert np.abs(np.asarray(v) - golden[text]).max() < 1e-5, text
