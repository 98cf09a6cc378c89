"""A pull that fails: each cause named in one line, and nothing left where a daemon looks for models (the
models folder's visible names; a cut download's bytes wait in the hidden .hub-partial/ for the next pull)."""

from __future__ import annotations

import errno
import time
from pathlib import Path
from typing import BinaryIO

import pytest

from helpers.fake_hub import FakeHub
from model_files.conftest import FOLDER_REPO, GGUF_REPO
from nvllm.model_files import hub as hub_module
from nvllm.model_files.hub import HubError, pull_from_hub

Q8 = "tiny-llama-Q8_0.gguf"


def _visible(models: Path) -> list[str]:
    return sorted(p.name for p in models.iterdir() if not p.name.startswith(".")) if models.is_dir() else []


def _parts(models: Path) -> list[Path]:
    return sorted((models / hub_module.PARTIAL_DIR).rglob("*.part"))


def test_a_file_whose_sha256_differs_is_deleted(hub: FakeHub, tmp_path: Path) -> None:
    hub.wrong_sha[(GGUF_REPO, Q8)] = "0" * 64
    with pytest.raises(HubError, match=rf"^{Q8} downloaded with sha256 [0-9a-f]{{64}}, the Hub says 0{{64}}; "
                                       "the file was deleted"):
        pull_from_hub(f"{GGUF_REPO}:Q8_0", tmp_path)
    assert _visible(tmp_path) == [] and _parts(tmp_path) == []
    assert not list(tmp_path.glob(".*.nvllm-pull.json"))


def test_a_folder_file_that_fails_its_check_leaves_no_folder(hub: FakeHub, tmp_path: Path) -> None:
    hub.wrong_sha[(FOLDER_REPO, "model.safetensors")] = "1" * 64
    with pytest.raises(HubError, match="model.safetensors downloaded with sha256"):
        pull_from_hub(FOLDER_REPO, tmp_path)
    assert _visible(tmp_path) == []


def test_a_cut_download_resumes_in_the_next_pull(hub: FakeHub, tmp_path: Path, no_retry_wait: None,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 tiny_quants: dict[str, Path]) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4096)   # so that a cut keeps what came before it
    whole = tiny_quants["Q8_0"].read_bytes()
    hub.cut[(GGUF_REPO, Q8)] = 50_000
    with pytest.raises(HubError, match="run the pull again to resume"):
        pull_from_hub(f"{GGUF_REPO}:Q8_0", tmp_path)
    assert _visible(tmp_path) == []
    (part,) = _parts(tmp_path)
    kept = part.stat().st_size
    assert 0 < kept <= 50_000 and part.read_bytes() == whole[:kept]

    del hub.cut[(GGUF_REPO, Q8)]
    hub.requests.clear()
    pulled = pull_from_hub(f"{GGUF_REPO}:Q8_0", tmp_path)
    assert pulled.path.read_bytes() == whole and _parts(tmp_path) == []
    ranges = [r for m, p, r in hub.requests if p.endswith(Q8)]
    assert ranges == [f"bytes={kept}-"]                      # only the rest was asked for


def test_a_connection_cut_once_is_resumed_within_the_pull(hub: FakeHub, tmp_path: Path, no_retry_wait: None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4096)
    hub.cut[(GGUF_REPO, Q8)] = 30_000
    hub.requests = _Healing(hub, (GGUF_REPO, Q8))
    assert pull_from_hub(f"{GGUF_REPO}:Q8_0", tmp_path).path.is_file()
    ranges = [r for m, p, r in hub.requests if p.endswith(Q8)]
    assert ranges[0] == "" and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-"


class _Healing(list):
    """hub.requests that lifts the cut of one file once it has been asked for."""

    def __init__(self, hub: FakeHub, key: tuple[str, str]) -> None:
        super().__init__()
        self.hub, self.key = hub, key

    def append(self, entry: tuple[str, str, str]) -> None:
        super().append(entry)
        if sum(e[1].endswith(self.key[1]) for e in self) == 2:     # the second request: the retry
            self.hub.cut.pop(self.key, None)


def test_a_repository_answering_500(hub: FakeHub, tmp_path: Path) -> None:
    hub.broken.add(GGUF_REPO)
    with pytest.raises(HubError, match=rf"^the Hub at {hub.url} answered 500 for {GGUF_REPO}: try again later$"):
        pull_from_hub(f"{GGUF_REPO}:Q8_0", tmp_path)
    assert _visible(tmp_path) == []


def test_an_unknown_repository(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(HubError, match=rf"^no repository nobody/nothing on {hub.url} \(or it is private: set "
                                       r"HF_TOKEN\)$"):
        pull_from_hub("nobody/nothing:Q4_0", tmp_path)


def test_a_gated_repository_needs_the_token(hub: FakeHub, tmp_path: Path, tiny_quants: dict[str, Path],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    hub.add_repo("gated/model-GGUF", {Q8: tiny_quants["Q8_0"].read_bytes()}, gated_token="hf_secret")
    with pytest.raises(HubError, match=r"^gated/model-GGUF is gated: accept its terms on its page and set "
                                       "HF_TOKEN$"):
        pull_from_hub("gated/model-GGUF:Q8_0", tmp_path)
    assert _visible(tmp_path) == []
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(HubError, match=r"^gated/model-GGUF is gated: the token \(HF_TOKEN\) has no access to it"):
        pull_from_hub("gated/model-GGUF:Q8_0", tmp_path)
    assert _visible(tmp_path) == []
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert pull_from_hub("gated/model-GGUF:Q8_0", tmp_path).path.is_file()


def test_a_hub_that_never_answers_is_given_up_in_bounded_time(hub: FakeHub, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    silent = hub.hanging_endpoint()
    monkeypatch.setenv("HF_ENDPOINT", silent)
    monkeypatch.setattr(constants, "ENDPOINT", silent)
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "0.5")
    t0 = time.monotonic()
    with pytest.raises(HubError, match=rf"^the Hub at {silent} did not answer in time \(HF_HUB_ETAG_TIMEOUT=0.5 s"):
        pull_from_hub(f"{GGUF_REPO}:Q8_0", tmp_path)
    assert time.monotonic() - t0 < 5
    assert _visible(tmp_path) == []


def test_a_download_that_stalls_is_given_up_in_bounded_time(hub: FakeHub, tmp_path: Path, no_retry_wait: None,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.2)   # each read; the library tries 6 times
    hub.stall.add((GGUF_REPO, Q8))
    t0 = time.monotonic()
    with pytest.raises(HubError, match=r"did not answer in time .*; run the pull again to resume$"):
        pull_from_hub(f"{GGUF_REPO}:Q8_0", tmp_path)
    assert time.monotonic() - t0 < 5
    assert _visible(tmp_path) == []


def test_too_little_room_is_found_before_downloading(hub: FakeHub, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub_module, "_disk_free", lambda path: 1000)
    with pytest.raises(HubError, match=rf"^not enough space in {tmp_path}: the pull needs 0.2 MB, 0.0 MB are free$"):
        pull_from_hub(f"{GGUF_REPO}:Q8_0", tmp_path)
    assert not [p for m, p, _ in hub.requests if "/resolve/" in p]


def test_a_full_disk_while_writing_leaves_nothing(hub: FakeHub, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import file_download

    def full(url: str, temp_file: BinaryIO, **kw: object) -> None:
        temp_file.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(file_download, "http_get", full)
    with pytest.raises(HubError, match=rf"^no space left on the disk of {tmp_path} \(the partial file was deleted\)$"):
        pull_from_hub(f"{GGUF_REPO}:Q8_0", tmp_path)
    assert _visible(tmp_path) == [] and _parts(tmp_path) == []
