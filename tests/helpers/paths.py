"""Where things are, for every test wherever it sits."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
MODELS = ROOT / "models"
GOLDEN = TESTS / "golden"
