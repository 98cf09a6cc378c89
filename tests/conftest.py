"""Shared fixtures: the tiny test models (made on demand) and the default model (pulled by the README's
test command; absent outside CI its tests are skipped, in CI its absence is a failure)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# CI runs the same examples every time, so a red run always reproduces; locally they vary and explore.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
TINY = ("tiny-llama", "tiny-qwen2", "tiny-llama-f16")
SMOLLM2 = MODELS / "smollm2-135m-instruct"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "aarch64: the subset deploy/aarch64-check.sh runs under emulation (pytest -m aarch64): "
                   "golden tests on the tiny models and one daemon round trip")


def _load_maker():
    spec = importlib.util.spec_from_file_location("make_test_models", MODELS / "make_test_models.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_test_models"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, Path]:
    """name -> folder of each tiny random model, written into models/ when missing."""
    missing = [n for n in TINY if not (MODELS / n / "config.json").exists()]
    if missing:
        _load_maker().make_all(MODELS, only=missing)
    return {n: MODELS / n for n in TINY}


@pytest.fixture(scope="session")
def smollm2() -> Path:
    if not (SMOLLM2 / "config.json").exists():
        if os.environ.get("CI"):
            pytest.fail(f"{SMOLLM2} is missing: CI must pull it (nvllm models pull smollm2-135m-instruct)")
        pytest.skip("the default model is not pulled (nvllm models pull smollm2-135m-instruct)")
    return SMOLLM2
