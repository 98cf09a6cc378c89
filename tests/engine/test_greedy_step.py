"""The common decode step's sampling: rows at temperature 0 with nothing applied before their argmax skip the
sampler's batch (sampling_rows.plain_greedy, sampler.greedy), and answer exactly as the full sampler does;
any row with something to apply (a penalty, bias, logprobs, a constraint, min_tokens still banning EOS, a
temperature) sends the whole step through the full sampler."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import nvllm.engine.llm_engine as llm_engine
from helpers.engines import backed_engine
from nvllm.config import Settings
from nvllm.engine.sampling_rows import plain_greedy, sampling_batch
from nvllm.model.sampling.sampler import greedy, sample
from nvllm.sampling_params import SamplingParams


def row(ahead: tuple[int, ...] = (), outputs: int = 0, structured: object = None, **params: Any) -> tuple:
    seq = SimpleNamespace(params=SamplingParams(**{"temperature": 0.0, **params}).resolve(), structured=structured,
                          num_output_tokens=outputs, output_token_ids=[], prompt_array=np.zeros(0, np.int64),
                          generator=np.random.default_rng(0), eos_token_ids=frozenset({2}))
    return seq, list(ahead)


@pytest.mark.parametrize(("changed", "plain"), [
    ({}, True), ({"ahead": (4, 5)}, True), ({"min_tokens": 3, "outputs": 3}, True),
    ({"temperature": 0.7}, False), ({"logprobs": 0}, False), ({"logit_bias": {3: 1.0}}, False),
    ({"presence_penalty": 0.5}, False), ({"frequency_penalty": -0.5}, False), ({"repetition_penalty": 1.1}, False),
    ({"min_tokens": 3, "outputs": 1}, False), ({"min_tokens": 3, "outputs": 1, "ahead": (7, 8)}, True),
    ({"structured": object()}, False)])
def test_a_row_is_plain_only_with_nothing_to_apply_before_its_argmax(changed: dict, plain: bool) -> None:
    assert plain_greedy([row(), row(**changed)]) is plain


def test_greedy_gives_what_the_sampler_gives_plain_rows() -> None:
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((5, 1000)).astype(np.float32)
    logits[2, 17] = logits[2, 900] = 50.0   # a tie: the first index, as argmax and the sampler take it
    rows = [row() for _ in range(5)]
    full, fast = sample(logits, sampling_batch(rows)), greedy(logits)
    np.testing.assert_array_equal(fast.token_ids, full.token_ids)
    assert fast.token_ids.dtype == np.int64 and fast.token_ids[2] == 17
    np.testing.assert_array_equal(fast.logprobs, full.logprobs)   # NaN: not asked
    assert fast.top_logprobs == full.top_logprobs == [None] * 5


def test_an_engines_answers_are_the_same_with_the_fast_path_and_without(tiny_models: dict[str, Path],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings()
    s.model.path = str(tiny_models["tiny-llama"])
    s.model.threads = 1
    e = backed_engine(s)
    plain = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
             SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, min_tokens=4)]
    penalised = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, repetition_penalty=1.3)
    fast_steps: list[int] = []
    real = llm_engine.greedy

    def counted(logits: np.ndarray) -> Any:
        fast_steps.append(1)
        return real(logits)

    monkeypatch.setattr(llm_engine, "greedy", counted)

    def answers(tag: str, params: list[SamplingParams]) -> list[list[int]]:
        for i, p in enumerate(params):
            e.add_request(f"{tag}-{i}", [5 + i, 6, 7, 8, 9], p)
        out: dict[str, list[int]] = {}
        while e.has_unfinished():
            for o in e.step():
                out.setdefault(o.request_id, []).extend(o.token_ids)
        return [out[f"{tag}-{i}"] for i in range(len(params))]

    fast = answers("fast", plain)
    assert len(fast_steps) >= 7    # the steps after the min_tokens row has its first 4 tokens
    fast_steps.clear()
    mixed = answers("mixed", [*plain, penalised])
    assert not fast_steps          # a penalised row in every step: each step took the full sampler
    monkeypatch.setattr(llm_engine, "plain_greedy", lambda rows: False)
    assert answers("full", plain) == fast
    assert answers("full-mixed", [*plain, penalised]) == mixed
