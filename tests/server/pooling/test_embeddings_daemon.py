"""End-to-end: the real daemon serving an embedding model and a reranker (`nvllm serve --model <BERT folder>`, its
task read from the files), driven by the official openai client's embeddings.create (which asks for base64
and decodes it), by plain HTTP for /v1/rerank, and by gRPC's Embed; a chat request to it refused naming the
model; health and /v1/models as for any model; and every page back afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx2 as httpx
import numpy as np
import openai
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from golden.pooling_cases import EMBED_TEXTS, RERANK_DOCUMENTS, RERANK_QUERY
from helpers.daemon_util import BASE_CONFIG, DaemonProcess, health, pages_all_back
from helpers.pooling_golden import golden_cases
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc


@pytest.fixture(scope="module")
def embedder(tiny_encoders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("embed-daemon"), tiny_encoders["tiny-bert"], BASE_CONFIG,
                      http_listen="127.0.0.1:0")
    yield d
    d.stop()


def test_the_openai_client_gets_transformers_embeddings(embedder: DaemonProcess) -> None:
    golden = {c["text"]: c["embedding"] for c in golden_cases("tiny-bert") if c["kind"] == "text"}
    with openai.OpenAI(base_url=embedder.http_url + "/v1", api_key="none", max_retries=0, timeout=60) as client:
        res = client.embeddings.create(model="tiny-bert", input=list(EMBED_TEXTS))
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="tiny-bert", messages=[{"role": "user", "content": "hi"}])
        listed = client.models.list()
    assert [d.index for d in res.data] == list(range(len(EMBED_TEXTS)))
    for d, text in zip(res.data, EMBED_TEXTS):
        got, want = np.asarray(d.embedding), np.asarray(golden[text])
        assert got @ want / np.linalg.norm(got) / np.linalg.norm(want) >= 0.9999, text
    assert res.usage.prompt_tokens == res.usage.total_tokens == sum(
        len(c["input_ids"]) for c in golden_cases("tiny-bert") if c["kind"] == "text")
    assert "gives embeddings" in str(refused.value) and refused.value.body["param"] == "model"   # type: ignore[index]
    assert [m.id for m in listed.data] == ["tiny-bert"]
    with grpc.insecure_channel(embedder.address) as channel:
        rpc = pb_grpc.GeneratorStub(channel).Embed(pb.EmbedRequest(inputs=[pb.EmbedInput(text=EMBED_TEXTS[1])]))
        assert health(embedder.address).state == pb.HealthResponse.STATE_SERVING
        # reflection serves the RPCs' descriptor, so grpcurl can call Embed and Rerank as they are
        reply = next(iter(reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(iter(
            [reflection_pb2.ServerReflectionRequest(file_containing_symbol="nvllm.v1.Generator")]), timeout=5)))
    files = [descriptor_pb2.FileDescriptorProto.FromString(b)
             for b in reply.file_descriptor_response.file_descriptor_proto]
    methods = {m.name for f in files for s in f.service if s.name == "Generator" for m in s.method}
    assert {"Embed", "Rerank", "Tokenize", "Generate"} <= methods
    assert np.allclose(list(rpc.embeddings[0].values), res.data[1].embedding, atol=1e-6)
    assert pages_all_back(health(embedder.address))


def test_a_reranker_daemon_ranks_the_documents(tiny_encoders: dict[str, Path], tmp_path: Path) -> None:
    logits = [c["logit"] for c in golden_cases("tiny-bert-reranker")]
    d = DaemonProcess(tmp_path, tiny_encoders["tiny-bert-reranker"], BASE_CONFIG, http_listen="127.0.0.1:0")
    try:
        r = httpx.post(d.http_url + "/v1/rerank", json={"query": RERANK_QUERY, "documents": list(RERANK_DOCUMENTS),
                                                         "top_n": 3}, timeout=60)
        assert pages_all_back(health(d.address))
    finally:
        d.stop()
    assert r.status_code == 200, r.text
    assert [x["index"] for x in r.json()["results"]] == sorted(range(len(logits)), key=lambda i: -logits[i])[:3]
