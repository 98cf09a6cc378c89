"""Ollama's /api/pull end to end: a real daemon whose puller is the Hub's (cli/model_sources.hub_puller over
model_files/hub.py, as `nvllm serve` wires it), pointed at the stand-in Hub by HF_ENDPOINT, driven by the
official `ollama` client: the progress Ollama streams, the model then answering /api/chat by the reference it
was pulled by, as /v1/chat/completions answers by its served name; a file whose sha256 differs and a Hub
that answers 500 end the pull with an error, leave nothing in the models directory a daemon would load, and
the daemon serving what it served."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx
import ollama
import pytest

from helpers.daemon_util import BASE_CONFIG, DaemonProcess
from helpers.fake_hub import FakeHub

REPO = "tiny-org/tiny-llama-GGUF"
FILE = "tiny-llama-Q8_0.gguf"
BAD_REPO = "tiny-org/corrupt-GGUF"
MESSAGES = [{"role": "user", "content": "Name a river."}]


@dataclass
class Served:
    process: DaemonProcess
    hub: FakeHub
    models: Path            # --models-dir: where pulls land


@pytest.fixture(scope="module")
def served(tiny: Path, tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from gguf import GGMLQuantizationType as T

    from helpers.gguf_util import write_gguf

    tmp = tmp_path_factory.mktemp("ollama-hub")
    made = write_gguf(tiny_models["tiny-llama"], tmp / FILE, T.Q8_0)
    models = tmp / "models"
    models.mkdir()
    with FakeHub() as hub:
        hub.add_repo(REPO, {FILE: made.read_bytes(), "README.md": b"# tiny\n"})
        hub.add_repo(BAD_REPO, {"corrupt-Q8_0.gguf": made.read_bytes()})
        hub.wrong_sha[(BAD_REPO, "corrupt-Q8_0.gguf")] = "0" * 64
        hub.add_repo("tiny-org/down-GGUF", {"down-Q8_0.gguf": made.read_bytes()})
        hub.broken.add("tiny-org/down-GGUF")
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp / "hf-home"), "HF_HUB_ETAG_TIMEOUT": "5",
               "HF_HUB_DOWNLOAD_TIMEOUT": "5", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": "",
               "HF_HUB_OFFLINE": ""}
        d = DaemonProcess(tmp / "daemon", tiny, BASE_CONFIG, http_listen="127.0.0.1:0", ollama_listen="127.0.0.1:0",
                          extra_args=("--models-dir", str(models)), extra_env=env)
        try:
            yield Served(d, hub, models)
        finally:
            d.stop()


def test_a_pull_from_the_hub_streams_progress_then_answers_by_its_reference(served: Served) -> None:
    c = ollama.Client(host=served.process.ollama_url, timeout=60)
    ref = f"hf.co/{REPO}:Q8_0"
    lines = list(c.pull(ref, stream=True))
    statuses = [p.status for p in lines]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
    data = served.hub.repos[REPO].files[FILE]
    parts = [p for p in lines if p.total]
    assert parts and parts[-1].completed == parts[-1].total == len(data)
    assert parts[0].digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert (served.models / FILE).read_bytes() == data

    name = FILE.removesuffix(".gguf")
    assert name in {m.model for m in c.list().models}
    assert c.show(ref).details.format == "gguf"                                     # type: ignore[union-attr]
    options = {"temperature": 0, "num_predict": 6}
    chat = c.chat(model=ref, messages=MESSAGES, options=options, stream=False)
    with httpx.Client(base_url=served.process.http_url, timeout=60) as h:
        v1 = h.post("/v1/chat/completions", json={"model": name, "messages": MESSAGES, "temperature": 0,
                                                  "max_tokens": 6})
    assert v1.status_code == 200, v1.text
    assert chat.message.content == v1.json()["choices"][0]["message"]["content"]
    assert chat.eval_count == v1.json()["usage"]["completion_tokens"]


@pytest.mark.parametrize("repo, cause", [(BAD_REPO, "sha256"), ("tiny-org/down-GGUF", "500")])
def test_a_pull_that_fails_leaves_nothing_and_the_daemon_serving(served: Served, repo: str, cause: str) -> None:
    c = ollama.Client(host=served.process.ollama_url, timeout=60)
    before = sorted(p.name for p in served.models.iterdir() if not p.name.startswith("."))
    with pytest.raises(ollama.ResponseError) as failed:
        list(c.pull(f"{repo}:Q8_0", stream=True))
    assert cause in failed.value.error, failed.value.error
    after = sorted(p.name for p in served.models.iterdir() if not p.name.startswith("."))
    assert after == before                       # nothing a daemon would load was left behind
    assert f"{repo}:Q8_0" not in {m.model for m in c.list().models}
    answer = c.generate(model="tiny-llama", prompt="hi", options={"num_predict": 2, "temperature": 0}, stream=False)
    assert answer.done and answer.eval_count == 2
