"""POST /v1/embeddings, /v1/rerank and /rerank, and the gRPC Embed and Rerank RPCs, in process over the real engine
with the tiny BERTs (models/tiny_encoders.py): the embeddings transformers gives (tests/golden/pooling_*.json) as
floats and as base64, over both APIs; the reranker's scores as sigmoids of transformers' logits, best first;
every refusal naming its field, in each API's own way; and all pages back afterwards."""

from __future__ import annotations

import base64
import math
import struct
from pathlib import Path
from typing import Any

import grpc
import httpx2 as httpx
import numpy as np
import pytest

from golden.pooling_cases import EMBED_TEXTS, RERANK_DOCUMENTS, RERANK_QUERY
from helpers.daemon_util import assert_pages_all_back
from helpers.http_app import error_of, serve_both
from helpers.pooling_golden import golden_cases
from nvllm import LLM
from nvllm.v1 import nvllm_pb2 as pb


@pytest.fixture(scope="module")
def embedder(tiny_encoders: dict[str, Path]) -> LLM:
    return LLM(tiny_encoders["tiny-bert"], max_num_seqs=8)


@pytest.fixture(scope="module")
def reranker(tiny_encoders: dict[str, Path]) -> LLM:
    return LLM(tiny_encoders["tiny-bert-reranker"], max_num_seqs=8)


def cosine(a: Any, b: Any) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_embeddings_are_transformers_over_both_apis(embedder: LLM) -> None:
    golden = {c["text"]: c for c in golden_cases("tiny-bert") if c["kind"] == "text"}
    ids = golden[EMBED_TEXTS[1]]["input_ids"]

    async def body(client: httpx.AsyncClient, stub: Any, state: Any) -> dict[str, Any]:
        got = {"float": (await client.post("/v1/embeddings", json={"input": list(EMBED_TEXTS)})).json(),
               "alone": (await client.post("/v1/embeddings", json={"input": EMBED_TEXTS[1]})).json(),
               "base64": (await client.post("/v1/embeddings", json={"input": EMBED_TEXTS[1], "model": "tiny-bert",
                                                                    "encoding_format": "base64"})).json(),
               "ids": (await client.post("/v1/embeddings", json={"input": ids})).json(),
               "rpc": await stub.Embed(pb.EmbedRequest(inputs=[pb.EmbedInput(text=t) for t in EMBED_TEXTS[:3]] + [
                   pb.EmbedInput(token_ids=pb.TokenIds(ids=ids))]))}
        assert_pages_all_back(embedder.engine)
        return got

    got = serve_both(embedder.engine, body, "tiny-bert")
    data = got["float"]["data"]
    assert [d["index"] for d in data] == list(range(len(EMBED_TEXTS))) and got["float"]["object"] == "list"
    for d, text in zip(data, EMBED_TEXTS):
        assert cosine(d["embedding"], golden[text]["embedding"]) >= 0.9999, text
        assert abs(np.linalg.norm(d["embedding"]) - 1) < 1e-5       # the folder's Normalize module
    tokens = sum(len(golden[t]["input_ids"]) for t in EMBED_TEXTS)
    assert got["float"]["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    # Alone in its step, the same text gives the same float32 bits each time (in a batch, BLAS may sum in
    # another order: within float32's rounding of it)
    alone = got["alone"]["data"][0]["embedding"]
    raw = base64.b64decode(got["base64"]["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == alone
    assert got["ids"]["data"][0]["embedding"] == alone                   # ids, or the text giving them
    assert np.allclose(alone, data[1]["embedding"], rtol=0, atol=1e-6)
    rpc = got["rpc"]
    assert np.allclose([list(e.values) for e in rpc.embeddings[:3]], [d["embedding"] for d in data[:3]], atol=1e-6)
    assert np.allclose(list(rpc.embeddings[3].values), alone, atol=1e-6)
    assert rpc.prompt_tokens == sum(e.prompt_tokens for e in rpc.embeddings) == \
        sum(len(golden[t]["input_ids"]) for t in EMBED_TEXTS[:3]) + len(ids)


def test_rerank_scores_are_sigmoids_of_transformers_logits_best_first(reranker: LLM) -> None:
    logits = [c["logit"] for c in golden_cases("tiny-bert-reranker")]
    want = sorted(range(len(logits)), key=lambda i: -logits[i])

    async def body(client: httpx.AsyncClient, stub: Any, state: Any) -> dict[str, Any]:
        got = {path: (await client.post(path, json={"query": RERANK_QUERY, "documents": list(RERANK_DOCUMENTS)})).json()
               for path in ("/v1/rerank", "/rerank")}
        got["top"] = (await client.post("/v1/rerank", json={
            "query": RERANK_QUERY, "documents": [{"text": d} for d in RERANK_DOCUMENTS], "top_n": 2,
            "return_documents": True})).json()
        got["rpc"] = await stub.Rerank(pb.RerankRequest(query=RERANK_QUERY, documents=RERANK_DOCUMENTS, top_n=3))
        assert_pages_all_back(reranker.engine)
        return got

    got = serve_both(reranker.engine, body, "tiny-bert-reranker")
    for path in ("/v1/rerank", "/rerank"):
        results = got[path]["results"]
        assert [r["index"] for r in results] == want
        for r in results:
            assert abs(r["relevance_score"] - 1 / (1 + math.exp(-logits[r["index"]]))) < 1e-3
        assert "document" not in results[0]
    assert got["/v1/rerank"]["usage"]["total_tokens"] == sum(len(c["input_ids"]) for c in golden_cases(
        "tiny-bert-reranker"))
    top = got["top"]["results"]
    assert [r["index"] for r in top] == want[:2] and top[0]["document"] == {"text": RERANK_DOCUMENTS[want[0]]}
    rpc = got["rpc"]
    assert [r.index for r in rpc.results] == want[:3]
    assert [round(r.relevance_score, 5) for r in rpc.results] == [round(r["relevance_score"], 5)
                                                                 for r in got["/rerank"]["results"][:3]]


LONG = " ".join(["harbour"] * 300)
HTTP_REFUSED = [  # (model: e for the embedder, r for the reranker), path, body, status, param, words
    ("e", "/v1/embeddings", {}, 400, "input", "input is required"),
    ("e", "/v1/embeddings", {"input": []}, 400, "input", "must not be empty"),
    ("e", "/v1/embeddings", {"input": ["a", 5]}, 400, "input[1]", "a string or a non-empty array"),
    ("e", "/v1/embeddings", {"input": "a", "encoding_format": "hex"}, 400, "encoding_format", "'float' or 'base64'"),
    ("e", "/v1/embeddings", {"input": ["a", LONG]}, 400, "input[1]", "at most the model's 128 tokens"),
    ("e", "/v1/embeddings", {"input": "a", "dimensions": 8}, 400, "dimensions", "not supported by this model"),
    ("e", "/v1/embeddings", {"input": "a", "dimensions": 0}, 400, "dimensions", "a positive integer"),
    ("e", "/v1/embeddings", {"input": [[1, 2], [5, 99999]]}, 400, "input[1]", "token ids in [0, "),
    ("e", "/v1/embeddings", {"input": "a", "model": "gpt-4"}, 404, "model", "does not exist"),
    ("e", "/v1/rerank", {"query": "a", "documents": ["b"]}, 400, "model", "gives embeddings"),
    ("e", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, 400, "model",
     "gives embeddings"),
    ("r", "/v1/embeddings", {"input": "a"}, 400, "model", "scores documents"),
    ("r", "/v1/rerank", {"query": "a"}, 400, "documents", "query and documents are required"),
    ("r", "/v1/rerank", {"query": "a", "documents": []}, 400, "documents", "must not be empty"),
    ("r", "/rerank", {"query": "a", "documents": ["b", 3]}, 400, "documents[1]", "a string or"),
    ("r", "/rerank", {"query": "a", "documents": ["b"], "top_n": -1}, 400, "top_n", "at least 0"),
    ("r", "/rerank", {"query": "a", "documents": ["b", LONG]}, 400, "documents[1]", "at most the model's 128"),
    ("r", "/rerank", {"query": LONG, "documents": ["b"], "truncate_prompt_tokens": 64}, 400, "query", "first text"),
]


@pytest.mark.parametrize("which", ["e", "r"])
def test_http_refusals_name_the_parameter(embedder: LLM, reranker: LLM, which: str) -> None:
    llm, name = (embedder, "tiny-bert") if which == "e" else (reranker, "tiny-bert-reranker")
    cases = [c for c in HTTP_REFUSED if c[0] == which]

    async def body(client: httpx.AsyncClient, stub: Any, state: Any) -> list[httpx.Response]:
        out = [await client.post(path, json=payload) for _, path, payload, *_ in cases]
        assert_pages_all_back(llm.engine)
        return out

    for r, (_, path, payload, status, param, words) in zip(serve_both(llm.engine, body, name), cases):
        err = error_of(r, status)
        assert err["param"] == param and words in err["message"], (path, payload, err)


def test_truncate_prompt_tokens_cuts_instead_of_refusing(embedder: LLM) -> None:
    """Text keeps its first tokens with [CLS] and [SEP]; token ids their last ones, as vLLM cuts them."""
    tok = embedder.tokenizer
    ids = tok.encode(LONG)
    cut_text = tok.encode(" ".join(["harbour"] * 300), add_special_tokens=False)[:14]
    cut_text = [ids[0], *cut_text, ids[-1]]

    async def body(client: httpx.AsyncClient, stub: Any, state: Any) -> list[Any]:
        asked = [{"input": LONG, "truncate_prompt_tokens": 16}, {"input": cut_text},
                 {"input": ids, "truncate_prompt_tokens": 16}, {"input": ids[-16:]}]
        return [(await client.post("/v1/embeddings", json=a)).json() for a in asked]

    text, text_ref, by_ids, ids_ref = serve_both(embedder.engine, body, "tiny-bert")
    assert text["data"][0]["embedding"] == text_ref["data"][0]["embedding"] and text["usage"]["prompt_tokens"] == 16
    assert by_ids["data"][0]["embedding"] == ids_ref["data"][0]["embedding"]


def test_grpc_refusals_are_invalid_argument_naming_the_field(embedder: LLM, reranker: LLM) -> None:
    async def call(method: Any, req: Any) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await method(req)
        return e.value

    async def on_embedder(client: httpx.AsyncClient, stub: Any, state: Any) -> list[grpc.aio.AioRpcError]:
        return [await call(stub.Embed, pb.EmbedRequest()),
                await call(stub.Embed, pb.EmbedRequest(inputs=[pb.EmbedInput(text="a"), pb.EmbedInput()])),
                await call(stub.Embed, pb.EmbedRequest(inputs=[pb.EmbedInput(text="a"), pb.EmbedInput(text=LONG)])),
                await call(stub.Embed, pb.EmbedRequest(inputs=[pb.EmbedInput(text="a")], dimensions=4)),
                await call(stub.Embed, pb.EmbedRequest(inputs=[pb.EmbedInput(text="a")], model="other")),
                await call(stub.Rerank, pb.RerankRequest(query="a", documents=["b"]))]

    async def on_reranker(client: httpx.AsyncClient, stub: Any, state: Any) -> list[grpc.aio.AioRpcError]:
        return [await call(stub.Rerank, pb.RerankRequest(query="a")),
                await call(stub.Rerank, pb.RerankRequest(query="a", documents=["b", LONG])),
                await call(stub.Embed, pb.EmbedRequest(inputs=[pb.EmbedInput(text="a")]))]

    want = [("inputs", "at least one"), ("inputs[1]", "text or token_ids"),
            ("inputs[1].text", "at most the model's 128 tokens"), ("dimensions", "not supported"),
            ("model", "the model 'other' does not exist; this daemon serves 'tiny-bert'"),
            ("model", "gives embeddings"),
            ("documents", "at least one"), ("documents[1]", "at most the model's 128"), ("model", "scores documents")]
    errors = serve_both(embedder.engine, on_embedder, "tiny-bert") + \
        serve_both(reranker.engine, on_reranker, "tiny-bert-reranker")
    for e, (field, words) in zip(errors, want):
        code = grpc.StatusCode.NOT_FOUND if "does not exist" in words else grpc.StatusCode.INVALID_ARGUMENT
        assert e.code() == code and (field in e.details() or code == grpc.StatusCode.NOT_FOUND) and \
            words in e.details(), (field, e.details())
