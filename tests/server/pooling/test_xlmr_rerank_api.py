"""POST /v1/rerank and the gRPC Rerank RPC in process over the real engine with tiny-xlmr-reranker (an XLM-RoBERTa
cross-encoder, bge-reranker's family), its folder and its GGUF: the results best first, each the sigmoid of
transformers' logit (tests/golden/pooling_tiny-xlmr-reranker.json), and all pages back afterwards."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from golden.pooling_cases import RERANK_DOCUMENTS, RERANK_QUERY
from helpers.daemon_util import assert_pages_all_back
from helpers.http_app import serve_both
from helpers.paths import GOLDEN
from helpers.pooling_golden import golden_cases
from nvllm import LLM
from nvllm.v1 import nvllm_pb2 as pb


@pytest.mark.parametrize("source", ["folder", "gguf"])
def test_rerank_gives_sigmoids_of_transformers_logits_best_first(tiny_encoders: dict[str, Path], source: str) -> None:
    path = tiny_encoders["tiny-xlmr-reranker"] if source == "folder" else \
        GOLDEN / "converted" / "tiny-xlmr-reranker.f32.gguf"
    reranker = LLM(path, max_num_seqs=8)
    cases = golden_cases("tiny-xlmr-reranker")
    logits = [c["logit"] for c in cases]
    want = sorted(range(len(logits)), key=lambda i: -logits[i])

    async def body(client: httpx.AsyncClient, stub: Any, state: Any) -> dict[str, Any]:
        got = {"http": (await client.post("/v1/rerank", json={"query": RERANK_QUERY,
                                                              "documents": list(RERANK_DOCUMENTS)})).json(),
               "rpc": await stub.Rerank(pb.RerankRequest(query=RERANK_QUERY, documents=RERANK_DOCUMENTS, top_n=2))}
        assert_pages_all_back(reranker.engine)
        return got

    got = serve_both(reranker.engine, body, "tiny-xlmr-reranker")
    results = got["http"]["results"]
    assert [r["index"] for r in results] == want
    for r in results:
        assert abs(r["relevance_score"] - 1 / (1 + math.exp(-logits[r["index"]]))) < 1e-5
    assert got["http"]["usage"]["total_tokens"] == sum(len(c["input_ids"]) for c in cases)
    assert [r.index for r in got["rpc"].results] == want[:2]
