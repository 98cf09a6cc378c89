"""Ollama's model endpoints on the real daemon, driven by the official `ollama` client on --ollama-listen's
own port: the probe and /api/version; /api/tags listing every model served (a folder, an embedder, a GGUF
found in the models directory with its pull record's aliases and digest); /api/show's details, model_info
and capabilities, by name, alias and ":latest"; /api/embed and /api/embeddings on a tiny BERT equal to
/v1/embeddings; /api/ps with expires_at after a keep_alive; /api/pull through the launcher's copying puller
(progress lines, then served by name and alias), a failed pull, /api/delete (its files gone, the default
model refused, an unknown one 404); bad bodies 400 and what nvllm does not do 501, all in Ollama's shape."""

from __future__ import annotations

import datetime
import hashlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx2 as httpx
import ollama
import pytest

from helpers.daemon_util import BASE_CONFIG, DaemonProcess
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc


@dataclass
class Ollama:
    process: DaemonProcess
    url: str           # --ollama-listen's
    http_url: str      # --http-listen's
    served: Path       # --models-dir, where pulls land


@pytest.fixture(scope="module")
def daemon(tiny: Path, tiny_encoders: dict[str, Path], tiny_ggufs: dict[str, Path],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ollama]:
    tmp = tmp_path_factory.mktemp("ollama")
    served, hub = tmp / "served", tmp / "hub"
    served.mkdir()
    hub.mkdir()
    seeded = served / "seeded.gguf"
    shutil.copyfile(tiny_ggufs["tiny-llama"], seeded)
    (served / ".seeded.gguf.nvllm-pull.json").write_text(json.dumps(
        {"source": "hf.co/test/Seeded:F32", "aliases": ["hf.co/test/Seeded:F32"], "files": {"seeded.gguf": "ab" * 32}}))
    shutil.copyfile(tiny_ggufs["tiny-llama"], hub / "pulled.gguf")
    d = DaemonProcess(tmp / "daemon", tiny, BASE_CONFIG, http_listen="127.0.0.1:0",
                      ollama_listen="127.0.0.1:0", extra_args=("--model", str(tiny_encoders["tiny-bert"]),
                                                               "--models-dir", str(served), "--pull-from", str(hub),
                                                               "--pull-into", str(served)))
    yield Ollama(d, d.ollama_url, d.http_url, served)
    d.stop()


def client(daemon: Ollama) -> ollama.Client:
    return ollama.Client(host=daemon.url, timeout=60)


def test_the_probe_and_the_version_on_both_ports(daemon: Ollama) -> None:
    for url in (daemon.url, daemon.http_url):
        with httpx.Client(base_url=url, timeout=30) as c:
            root, head, version = c.get("/"), c.head("/"), c.get("/api/version").json()
            assert root.text == "Ollama is running" and root.headers["content-type"].startswith("text/plain")
            assert head.status_code == 200 and version["version"] == "0.12.0" and version["nvllm_version"]
            assert c.get("/v1/models").status_code == 200     # one app on both listeners


def test_tags_list_every_model_served(daemon: Ollama) -> None:
    listed = {m.model: m for m in client(daemon).list().models}
    assert set(listed) == {"tiny-llama", "tiny-bert", "seeded"}
    seeded = daemon.served / "seeded.gguf"
    s = listed["seeded"]
    assert s.digest == "ab" * 32 and s.size == seeded.stat().st_size and s.details is not None
    assert s.details.format == "gguf" and s.details.family == "llama" and s.details.quantization_level == "F32"
    assert s.modified_at is not None and abs(s.modified_at.timestamp() - seeded.stat().st_mtime) < 1
    t = listed["tiny-llama"]
    assert t.details is not None and t.details.format == "safetensors" and t.details.families == ["llama"]
    assert t.details.parameter_size and len(t.digest or "") == 64
    assert listed["tiny-bert"].details.family == "bert"                   # type: ignore[union-attr]


def test_show_by_name_alias_and_latest(daemon: Ollama) -> None:
    c = client(daemon)
    chat, bert = c.show("tiny-llama"), c.show("tiny-bert:latest")
    assert chat.capabilities == ["completion"] and bert.capabilities == ["embedding"]
    info = chat.modelinfo or {}
    assert info["general.architecture"] == "llama" and info["general.parameter_count"] > 0
    assert info["llama.context_length"] > 0 and info["llama.block_count"] > 0 and info["llama.embedding_length"] > 0
    assert chat.template and chat.details is not None and chat.details.family == "llama"
    by_alias = c.show("hf.co/test/Seeded:F32")
    assert by_alias.details is not None and by_alias.details.format == "gguf"
    with pytest.raises(ollama.ResponseError) as e:
        c.show("gpt-9")
    assert e.value.status_code == 404 and e.value.error == "model 'gpt-9' not found"
    with grpc.insecure_channel(daemon.process.address) as ch:     # gRPC reads an alias as the served name too
        stub = pb_grpc.GeneratorStub(ch)
        tokens = stub.Tokenize(pb.TokenizeRequest(model="hf.co/test/Seeded:F32", prompt="hi"), timeout=30)
        same = stub.Tokenize(pb.TokenizeRequest(model="seeded:latest", prompt="hi"), timeout=30)
    assert list(tokens.token_ids) == list(same.token_ids) and tokens.token_ids


def test_embed_and_embeddings_then_ps_after_keep_alive(daemon: Ollama) -> None:
    c = client(daemon)
    res = c.embed(model="tiny-bert", input=["the cat sat", "a dog ran"], keep_alive="10m")
    old = c.embeddings(model="tiny-bert", prompt="the cat sat")
    with httpx.Client(base_url=daemon.http_url, timeout=60) as h:
        openai = h.post("/v1/embeddings", json={"model": "tiny-bert", "input": ["the cat sat", "a dog ran"]}).json()
    assert len(res.embeddings) == 2 and res.prompt_eval_count == openai["usage"]["prompt_tokens"] > 0
    assert (res.total_duration or 0) > 0
    for got, want in zip(res.embeddings, openai["data"]):
        assert got == pytest.approx(want["embedding"], abs=1e-6)
    assert list(old.embedding) == pytest.approx(res.embeddings[0], abs=1e-6)
    long = " ".join(["word"] * 3000)                           # past tiny-bert's context
    assert len(c.embed(model="tiny-bert", input=long).embeddings[0]) == len(res.embeddings[0])   # truncated
    with pytest.raises(ollama.ResponseError) as too_long:
        c.embed(model="tiny-bert", input=long, truncate=False)
    assert too_long.value.status_code == 400
    now = datetime.datetime.now(datetime.timezone.utc)
    loaded = {m.model: m for m in c.ps().models}
    assert {"tiny-llama", "tiny-bert"} <= set(loaded)
    bert = loaded["tiny-bert"]
    assert bert.expires_at is not None and 590 <= (bert.expires_at - now).total_seconds() <= 601
    assert (bert.size or 0) > 0 and bert.size_vram == 0 and (bert.context_length or 0) > 0


def test_pull_streams_progress_then_serves_the_model_and_delete_removes_it(daemon: Ollama) -> None:
    c = client(daemon)
    lines = list(c.pull("test/Pulled:F32", stream=True))
    statuses = [p.status for p in lines]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success" and statuses.count("success") == 1
    parts = [p for p in lines if p.total]
    data = (daemon.served / "pulled.gguf").read_bytes()
    assert parts and parts[-1].completed == parts[-1].total == len(data)
    assert parts[0].digest == "sha256:" + hashlib.sha256(data).hexdigest()
    listed = {m.model: m for m in c.list().models}
    assert listed["pulled"].digest == hashlib.sha256(data).hexdigest()
    assert c.show("hf.co/test/Pulled:F32").details.format == "gguf"        # type: ignore[union-attr]
    assert c.pull("pulled:latest", stream=False).status == "success"       # served already: done at once
    with httpx.Client(base_url=daemon.http_url, timeout=60) as h:
        answer = h.post("/v1/completions", json={"model": "test/Pulled:F32", "prompt": "hi", "max_tokens": 2})
    assert answer.status_code == 200 and answer.json()["model"] == "pulled", answer.text
    assert c.delete("pulled").status == "success"
    assert not (daemon.served / "pulled.gguf").exists()
    assert not (daemon.served / ".pulled.gguf.nvllm-pull.json").exists()
    assert "pulled" not in {m.model for m in c.list().models}
    with pytest.raises(ollama.ResponseError) as gone:
        c.show("hf.co/test/Pulled:F32")
    assert gone.value.status_code == 404


def test_failed_pulls_and_refused_deletes(daemon: Ollama) -> None:
    c = client(daemon)
    with pytest.raises(ollama.ResponseError) as streamed:
        list(c.pull("test/Missing", stream=True))
    assert "'test/Missing' does not exist" in streamed.value.error
    with pytest.raises(ollama.ResponseError) as whole:
        c.pull("test/Missing", stream=False)
    assert whole.value.status_code == 500 and "does not exist" in whole.value.error
    with pytest.raises(ollama.ResponseError) as default:
        c.delete("tiny-llama")
    assert default.value.status_code == 400 and "default model" in default.value.error
    with pytest.raises(ollama.ResponseError) as unknown:
        c.delete("gpt-9")
    assert unknown.value.status_code == 404 and unknown.value.error == "model 'gpt-9' not found"
    assert {m.model for m in c.list().models} == {"tiny-llama", "tiny-bert", "seeded"}


def test_bad_bodies_and_what_nvllm_does_not_do(daemon: Ollama) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as h:
        cases = [h.post("/api/show", content=b"{not json"), h.post("/api/show", json={}),
                 h.post("/api/show", json={"model": 5}), h.post("/api/embed", json={"model": "tiny-bert", "input": 5}),
                 h.post("/api/embed", json={"model": "tiny-bert", "input": "x", "keep_alive": "soon"}),
                 h.post("/api/pull", json={"model": "x", "stream": "yes"})]
        for r in cases:
            assert r.status_code == 400 and set(r.json()) == {"error"}, r.text
        assert cases[1].json()["error"] == "model is required"
        for r in (h.post("/api/copy", json={"source": "a", "destination": "b"}), h.post("/api/create", json={}),
                  h.post("/api/push", json={"model": "tiny-llama"}), h.head("/api/blobs/sha256:00")):
            assert r.status_code == 501, r.text
        assert "nvllm does not copy a model" in h.post("/api/copy", json={}).json()["error"]
