"""The embedding and reranking goldens transformers wrote (tests/golden/make_golden_pooling.py), by model."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parent.parent / "golden"


def golden(name: str) -> dict[str, Any]:
    return json.loads((GOLDEN / f"pooling_{name}.json").read_text())


def golden_cases(name: str) -> list[dict[str, Any]]:
    return golden(name)["cases"]
