"""What the pinned-prompt and persisted-cache tests share: engines built with cache settings, run until
their warm-up is over, and prompt files written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nvllm import LLM, SamplingParams
from nvllm.config import load_settings
from nvllm.engine.assembly.factory import build_engine

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
SYSTEM = ("You are the flight assistant of a survey drone. Answer in one short sentence, give numbers "
          "with their units, never guess a position, and say so when the telemetry does not hold the "
          "answer. Battery, altitude, heading and the mission's waypoints are in the telemetry below.")


def write_prompt(path: Path, prompt: Any) -> str:
    path.write_text(json.dumps(prompt))
    return str(path)


def engine_llm(model: Path, num_blocks: int = 64, warm: bool = True, scheduler: dict[str, Any] | None = None,
               **cache: Any) -> LLM:
    """An LLM on `model` with these [cache] settings; warm: stepped until the warm-up is over."""
    settings = load_settings(overrides={"model": {"path": str(model)}, "scheduler": scheduler or {},
                                        "cache": {"num_blocks": num_blocks, "block_size": 16, **cache}})
    llm = LLM.from_engine(build_engine(settings))
    if warm:
        finish_warmup(llm)
    return llm


def finish_warmup(llm: LLM) -> None:
    while llm.engine.has_unfinished():
        assert llm.engine.step() == [], "the warm-up's requests are the engine's own"


def pinned_pages(llm: LLM) -> list[int]:
    w = llm.engine.warmup
    return [] if w is None else w.pinned_pages


def assert_clean_but_pinned(llm: LLM) -> None:
    """After every request ends: the books hold, and every backed page is free or cached but the pinned."""
    bm = llm.engine.block_manager
    w = llm.engine.warmup
    bm.check_integrity([] if w is None else w.holds)
    assert bm.num_free_blocks == bm.num_backed_blocks - len(set(pinned_pages(llm))) - (bm.null >= 0)
