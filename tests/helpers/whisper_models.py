"""The tiny Whisper folders (models/tiny_whisper.py), the stand-in windows their goldens were made on, and the
goldens (tests/golden/whisper/, written by tools/whisper_goldens_model.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from safetensors.numpy import load_file

from helpers.paths import GOLDEN, MODELS

WHISPERS = ("tiny-whisper", "tiny-whisper-f16", "tiny-whisper-multi", "tiny-whisper-v3")


def _script(name: str) -> ModuleType:
    """A maker of models/, which import each other by name."""
    if str(MODELS) not in sys.path:
        sys.path.insert(0, str(MODELS))
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, MODELS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def make_whispers(names: tuple[str, ...] = WHISPERS) -> dict[str, Path]:
    """name -> folder in models/, written when missing."""
    missing = [n for n in names if not (MODELS / n / "model.safetensors").exists()]
    if missing:
        _script("make_test_models").make_all(MODELS, only=missing)
    return {n: MODELS / n for n in names}


def features(mels: int, case: int) -> np.ndarray:
    """tiny_whisper.golden_features: the window of the goldens' case."""
    return _script("tiny_whisper").golden_features(mels, case)


class WhisperGolden:
    def __init__(self, name: str) -> None:
        path = GOLDEN / "whisper" / f"{name}.safetensors"
        if not path.exists():
            pytest.fail(f"{path} is missing: run tools/whisper_goldens_model.py")
        self.t = load_file(path)
        meta = json.loads(path.with_suffix(".json").read_text())
        self.greedy = meta["greedy"]
        self.folder_sha256 = meta["folder_sha256"]
        self.subset = self.t["vocab_subset"]

    def __getitem__(self, key: str) -> np.ndarray:
        return self.t[key]
