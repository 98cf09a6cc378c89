"""Ollama's model listings shaped from a model's files (server/http/ollama_models.py over
engine/assembly/describe.py): a GGUF and a folder described without loading them, parameter sizes as Ollama
writes them, capabilities (tools where the template reads them, thinking where the model thinks, embedding
for an embedder), digests from the pull record or else stable, and --ollama-listen off loopback refused
without TLS or a key, as --http-listen is."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from helpers.paths import ROOT
from nvllm.config import Settings
from nvllm.engine.assembly.factory import ModelDescription, describe_model, human_count
from nvllm.server.http.ollama_models import capabilities, digest, parameters_text, show_body, tags_entry


def described(path: Path) -> ModelDescription:
    s = Settings()
    s.model.path = str(path)
    return describe_model(s)


def test_a_gguf_and_a_folder_described_from_their_files(tiny: Path, tiny_ggufs: dict[str, Path],
                                                        tiny_encoders: dict[str, Path]) -> None:
    g, f, e = described(tiny_ggufs["tiny-llama"]), described(tiny), described(tiny_encoders["tiny-bert"])
    for d in (g, f):
        assert d.architecture == "llama" and d.parameter_count > 0 and d.block_count > 0
        assert d.context_length > 0 and d.embedding_length > 0 and d.head_count >= d.head_count_kv > 0
        assert d.task == "generate" and d.chat_template
    assert (g.format, g.quantization, f.format) == ("gguf", "F32", "safetensors")
    assert g.parameter_count == f.parameter_count
    assert e.task == "embed" and e.architecture == "bert"
    body = show_body("tiny-llama", tiny, f, False, None)
    assert body["capabilities"] == ["completion"] and body["model_info"]["llama.block_count"] == f.block_count
    assert capabilities(e, True) == ["embedding"]


def test_capabilities_follow_the_template_and_the_parser(tiny: Path) -> None:
    d = described(tiny)
    tools = dataclasses.replace(d, takes_tools=True)
    thinks = dataclasses.replace(d, chat_template="{{ '<think>' }}")
    assert capabilities(tools, False) == ["completion", "tools"]
    assert capabilities(thinks, False) == ["completion", "thinking"]
    assert capabilities(d, True) == ["completion", "thinking"]
    assert capabilities(dataclasses.replace(d, task="rerank"), True) == []
    assert parameters_text({"temperature": 0.6, "top_k": 20}) == f"{'temperature':<30} 0.6\n{'top_k':<30} 20"


def test_parameter_sizes_as_ollama_writes_them() -> None:
    assert [human_count(n) for n in (812, 134_515_008, 1_543_714_304, 7_000_000_000, 40_000)] == \
        ["812", "134.52M", "1.54B", "7B", "40K"]


def test_digests_from_the_pull_record_else_stable(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    plain = digest(gguf)
    assert len(plain) == 64 and digest(gguf) == plain
    (tmp_path / ".m.gguf.nvllm-pull.json").write_text(json.dumps({"files": {"m.gguf": "cd" * 32}}))
    assert digest(gguf) == "cd" * 32
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / ".nvllm-pull.json").write_text(json.dumps({"files": {"b": "2", "a": "1"}}))
    assert len(digest(folder)) == 64 and digest(folder) != plain
    entry = tags_entry("m", gguf, None)
    assert entry["size"] == 64 and entry["digest"] == "cd" * 32 and entry["modified_at"].endswith("Z")


def test_ollama_listen_off_loopback_needs_tls_or_a_key(tiny: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "nvllm.cli", "serve", "--model", str(tiny), "--listen", "127.0.0.1:0",
                        "--ollama-listen", "0.0.0.0:0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "without TLS or an API key" in r.stderr and "0.0.0.0:0" in r.stderr
