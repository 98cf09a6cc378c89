"""The deploy tests' shared fixtures: what the test command pulled into models/ for the registry tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.smollm2_pull import NAME
from nvllm.model_files import registry


@pytest.fixture(scope="module")
def pulled(smollm2: Path) -> Path:
    """The folder the test command pulled into models/ (`nvllm models pull smollm2-135m-instruct --folder`):
    the tests read that pull's output rather than convert the GGUF a second time."""
    assert registry.is_complete(NAME, smollm2), f"{smollm2} is not a complete pull of this version: pull it again"
    return smollm2


@pytest.fixture(scope="module")
def pulled_gguf(pulled: Path) -> Path:
    """The GGUF the same pull kept beside the folder."""
    gguf = registry.gguf_file(pulled.parent, NAME)
    assert registry.has_verified_gguf(NAME, gguf), f"{gguf} is missing or not the published file: pull again"
    return gguf
