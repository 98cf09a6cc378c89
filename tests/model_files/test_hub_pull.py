"""Pulls from the stand-in Hub (conftest.py): one GGUF of a repository by its quantization, a folder of
safetensors, config and tokenizer files; each lands whole in the models folder with its record, and serves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.fake_hub import FakeHub
from model_files.conftest import FOLDER_REPO, GGUF_REPO
from nvllm.model_files import listing
from nvllm.model_files.hub import HubError, find_pulled, pull_from_hub, sidecar_path


def _downloads(hub: FakeHub) -> list[str]:
    return [p for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p]


def test_a_quantization_pulls_its_gguf_which_loads_and_generates(hub: FakeHub, tmp_path: Path,
                                                                 tiny_quants: dict[str, Path]) -> None:
    from nvllm import LLM, SamplingParams

    events: list[dict] = []
    pulled = pull_from_hub(f"hf.co/{GGUF_REPO}:q8_0", tmp_path, events.append)
    assert pulled.path == tmp_path / "tiny-llama-Q8_0.gguf" and pulled.name == "tiny-llama-Q8_0"
    assert pulled.path.read_bytes() == tiny_quants["Q8_0"].read_bytes()
    assert pulled.source == f"hf.co/{GGUF_REPO}:Q8_0"
    assert {f"hf.co/{GGUF_REPO}:q8_0", f"hf.co/{GGUF_REPO}:Q8_0", f"{GGUF_REPO}:Q8_0"} <= set(pulled.aliases)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hub-partial", ".tiny-llama-Q8_0.gguf.nvllm-pull.json",
                                                         "tiny-llama-Q8_0.gguf"]
    assert not [p for p in (tmp_path / ".hub-partial").rglob("*") if p.suffix != ".lock"]
    rec = json.loads(sidecar_path(pulled.path).read_text())
    assert rec["source"] == pulled.source and rec["aliases"] == pulled.aliases and rec["repo"] == GGUF_REPO
    assert rec["files"] == {"tiny-llama-Q8_0.gguf": __import__("hashlib").sha256(pulled.path.read_bytes()).hexdigest()}
    assert _downloads(hub) == [f"/{GGUF_REPO}/resolve/{hub.repos[GGUF_REPO].commit}/tiny-llama-Q8_0.gguf"]

    # Ollama's pull stream: the manifest, the file by its digest with counts, the check, success
    assert events[0] == {"status": "pulling manifest"} and events[-1] == {"status": "success"}
    assert {"status": "verifying sha256 digest"} in events
    counts = [e for e in events if "completed" in e]
    size = pulled.path.stat().st_size
    assert counts and counts[-1]["completed"] == size and all(e["total"] == size for e in counts)
    assert counts[-1]["digest"] == "sha256:" + rec["files"]["tiny-llama-Q8_0.gguf"]
    assert counts[-1]["status"] == "pulling " + rec["files"]["tiny-llama-Q8_0.gguf"][:12]

    llm = LLM(str(pulled.path), num_blocks=16, max_model_len=64, threads=1)
    out = llm.generate("Hello", SamplingParams(max_tokens=4, temperature=0.0))
    assert len(out[0].token_ids) == 4


def test_a_folder_pull_takes_only_the_files_nvllm_reads(hub: FakeHub, tmp_path: Path,
                                                        tiny_models: dict[str, Path]) -> None:
    from nvllm.config import Settings
    from nvllm.engine.assembly import factory

    pulled = pull_from_hub(FOLDER_REPO, tmp_path)
    assert pulled.path == tmp_path / "tiny-llama" and pulled.source == f"hf.co/{FOLDER_REPO}"
    got = sorted(p.relative_to(pulled.path).as_posix() for p in pulled.path.rglob("*") if p.is_file())
    assert got == [".nvllm-pull.json", "1_Pooling/config.json", "config.json", "generation_config.json",
                   "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (pulled.path / name).read_bytes() == (tiny_models["tiny-llama"] / name).read_bytes()
    row = listing.list_models(tmp_path)
    assert [(r["name"], r["complete"], r.get("source")) for r in row] == [("tiny-llama", True, pulled.source)]
    s = Settings()
    s.model.path = str(pulled.path)
    assert factory.load_model(s).info.num_layers > 0


def test_a_second_pull_of_the_same_commit_downloads_nothing(hub: FakeHub, tmp_path: Path) -> None:
    first = pull_from_hub(f"{GGUF_REPO}:Q4_0", tmp_path)
    n = len(_downloads(hub))
    again = pull_from_hub(f"hf.co/{GGUF_REPO}:Q4_0", tmp_path)
    assert again.path == first.path and len(_downloads(hub)) == n
    assert f"hf.co/{GGUF_REPO}:Q4_0" in again.aliases

    repo = hub.repos[GGUF_REPO]
    repo.commit = "1" * 40                        # a new commit that left the file as it was: the record alone
    pull_from_hub(f"{GGUF_REPO}:Q4_0", tmp_path)
    assert len(_downloads(hub)) == n and json.loads(sidecar_path(first.path).read_text())["commit"] == "1" * 40

    repo.commit = "2" * 40                        # one that changed it: pulled again, in place
    repo.files["tiny-llama-Q4_0.gguf"] = repo.files["tiny-llama-Q8_0.gguf"]
    pull_from_hub(f"{GGUF_REPO}:Q4_0", tmp_path)
    assert len(_downloads(hub)) == n + 1 and first.path.read_bytes() == repo.files["tiny-llama-Q8_0.gguf"]
    assert json.loads(sidecar_path(first.path).read_text())["commit"] == "2" * 40


def test_a_folder_of_a_new_commit_is_replaced_whole(hub: FakeHub, tmp_path: Path) -> None:
    first = pull_from_hub(FOLDER_REPO, tmp_path)
    repo = hub.repos[FOLDER_REPO]
    repo.commit = "3" * 40
    n = len(_downloads(hub))
    assert pull_from_hub(FOLDER_REPO, tmp_path).path == first.path and len(_downloads(hub)) == n
    repo.commit = "4" * 40
    repo.files["generation_config.json"] = b'{"temperature": 0.5}'
    pull_from_hub(FOLDER_REPO, tmp_path)
    new = [p.rsplit("/", 1)[1] for p in _downloads(hub)[n:]]
    assert "model.safetensors" not in new and "generation_config.json" in new     # the weights were kept
    assert (first.path / "generation_config.json").read_bytes() == b'{"temperature": 0.5}'
    assert json.loads((first.path / ".nvllm-pull.json").read_text())["commit"] == "4" * 40
    assert _visible_names(tmp_path) == ["tiny-llama"]


def _visible_names(models: Path) -> list[str]:
    return sorted(p.name for p in models.iterdir() if not p.name.startswith("."))


def test_a_pulled_model_is_found_offline_by_any_of_its_names(hub: FakeHub, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    pulled = pull_from_hub(f"{GGUF_REPO}:Q8_0", tmp_path)
    hub.stop()
    for ref in (f"{GGUF_REPO}:Q8_0", f"hf.co/{GGUF_REPO}:q8_0", f"huggingface.co/{GGUF_REPO}:Q8_0",
                f"{GGUF_REPO}/tiny-llama-Q8_0.gguf"):
        found = find_pulled(ref, tmp_path)
        assert found is not None and found.path == pulled.path, ref
    assert find_pulled(f"{GGUF_REPO}:Q4_0", tmp_path) is None
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")                 # a pull offline: what is there, or a clear no
    assert pull_from_hub(f"hf.co/{GGUF_REPO}:Q8_0", tmp_path).path == pulled.path
    with pytest.raises(HubError, match=f"^HF_HUB_OFFLINE is set and no earlier pull of {GGUF_REPO}:Q4_0 is in"):
        pull_from_hub(f"{GGUF_REPO}:Q4_0", tmp_path)
    pulled.path.unlink()                                   # a record without its file is no model
    assert find_pulled(f"{GGUF_REPO}:Q8_0", tmp_path) is None


def test_the_default_of_a_gguf_repository_and_a_file_by_name(hub: FakeHub, tmp_path: Path) -> None:
    # neither Q4_K_M nor Q4_0's fallback... Q4_0 is here: llama-server's second choice
    assert pull_from_hub(GGUF_REPO, tmp_path).path.name == "tiny-llama-Q4_0.gguf"
    got = pull_from_hub(f"{GGUF_REPO}/tiny-llama-Q8_0.gguf", tmp_path)
    assert got.path.name == "tiny-llama-Q8_0.gguf" and got.source == f"hf.co/{GGUF_REPO}:Q8_0"


def test_a_revision_is_pulled_and_recorded(hub: FakeHub, tmp_path: Path) -> None:
    commit = hub.repos[GGUF_REPO].commit
    pulled = pull_from_hub(f"{GGUF_REPO}:Q8_0", tmp_path, revision=commit)
    rec = json.loads(sidecar_path(pulled.path).read_text())
    assert rec["revision"] == rec["commit"] == commit
    with pytest.raises(HubError, match=f"^{GGUF_REPO} has no such revision$"):
        pull_from_hub(f"{GGUF_REPO}:Q8_0", tmp_path, revision="v9")


def test_a_missing_quantization_names_the_ones_the_repository_has(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(HubError, match=r"has no Q5_K_M GGUF: it has Q4_0, Q8_0$"):
        pull_from_hub(f"{GGUF_REPO}:Q5_K_M", tmp_path)
    with pytest.raises(HubError, match="has no file nope.gguf"):
        pull_from_hub(f"{GGUF_REPO}/nope.gguf", tmp_path)
    assert not [p for p in tmp_path.iterdir() if not p.name.startswith(".")]


def test_a_split_gguf_is_refused(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo("org/split-GGUF", {"m-Q4_K_M-00001-of-00002.gguf": b"a" * 2000,
                                    "m-Q4_K_M-00002-of-00002.gguf": b"b" * 2000})
    with pytest.raises(HubError, match=r"split GGUF \(2 parts\).*llama-gguf-split --merge"):
        pull_from_hub("org/split-GGUF:Q4_K_M", tmp_path)


def test_a_name_another_model_holds_is_refused(hub: FakeHub, tmp_path: Path,
                                               tiny_quants: dict[str, Path]) -> None:
    (tmp_path / "tiny-llama-Q8_0.gguf").write_bytes(b"mine")
    with pytest.raises(HubError, match="exists and was not pulled from the Hub; remove it or pull into another"):
        pull_from_hub(f"{GGUF_REPO}:Q8_0", tmp_path)
    assert (tmp_path / "tiny-llama-Q8_0.gguf").read_bytes() == b"mine"


def test_the_puller_a_daemon_is_given(hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nvllm.cli.model_sources import hub_puller
    from nvllm.model_files import registry

    events: list[dict] = []
    name, path, aliases = hub_puller(tmp_path)(f"hf.co/{GGUF_REPO}:Q8_0", events.append)
    assert (name, path) == ("tiny-llama-Q8_0", tmp_path / "tiny-llama-Q8_0.gguf") and path.is_file()
    assert f"hf.co/{GGUF_REPO}:Q8_0" in aliases and events[-1] == {"status": "success"}
    # a name the registry knows goes to the registry (its GGUF from its wheel)
    monkeypatch.setattr(registry, "pull", lambda n, d, progress: Path(d) / f"{n}.gguf")
    assert hub_puller(tmp_path)("smollm2-135m-instruct:latest", events.append) == (
        "smollm2-135m-instruct", tmp_path / "smollm2-135m-instruct.gguf", ["smollm2-135m-instruct"])
    with pytest.raises(HubError, match="is not a Hugging Face Hub reference"):
        hub_puller(tmp_path)("no-such-model", events.append)
