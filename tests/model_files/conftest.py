"""The stand-in Hub (tests/helpers/fake_hub.py) with its made repositories, and the environment that points
huggingface_hub at it: no test of a pull reaches the internet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.fake_hub import FakeHub

GGUF_REPO = "tiny-org/tiny-llama-GGUF"
FOLDER_REPO = "tiny-org/tiny-llama"


@pytest.fixture(scope="session")
def tiny_quants(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """tiny-llama as two GGUFs, named as the Hub's GGUF repositories name them: quant -> file."""
    from gguf import GGMLQuantizationType as T

    from helpers.gguf_util import write_gguf

    out = tmp_path_factory.mktemp("hub-ggufs")
    return {q: write_gguf(tiny_models["tiny-llama"], out / f"tiny-llama-{q}.gguf", t)
            for q, t in (("Q8_0", T.Q8_0), ("Q4_0", T.Q4_0))}


@pytest.fixture
def hub(tiny_quants: dict[str, Path], tiny_models: dict[str, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A running stand-in Hub serving the tiny GGUF repository (two quantizations, a README) and the tiny
    folder repository (with files nvllm does not read beside it); HF_ENDPOINT set to it, HF_HOME in tmp."""
    from huggingface_hub import constants
    from huggingface_hub.utils import _detect_agent

    with FakeHub() as fake:
        fake.add_repo(GGUF_REPO, {**{p.name: p.read_bytes() for p in tiny_quants.values()},
                                  "README.md": b"# tiny\n"})
        fake.add_folder(FOLDER_REPO, tiny_models["tiny-llama"],
                        {"README.md": b"# tiny\n", "pytorch_model.bin": b"\0" * 4096,
                         "onnx/model.onnx": b"\0" * 2048, "1_Pooling/config.json": b"{}",
                         "consolidated.safetensors": b"\0" * 2048})
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "2")
        monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "2")
        for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
            monkeypatch.delenv(var, raising=False)
        # what the library read at import (before HF_ENDPOINT was set here): its own calls go here too
        monkeypatch.setattr(constants, "ENDPOINT", fake.url)
        monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 2)
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
        monkeypatch.setattr(_detect_agent, "_registry", {"standardEnvVars": [], "harnesses": {}})
        yield fake


@pytest.fixture
def no_retry_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub waits 1 s before each retry of a cut download: not in the tests."""
    import time
    import types

    from huggingface_hub import file_download

    names = {n: getattr(time, n) for n in dir(time) if not n.startswith("_")}
    monkeypatch.setattr(file_download, "time", types.SimpleNamespace(**{**names, "sleep": lambda s: None}))
