"""A drone command under its JSON Schema finishes within 160 tokens on the default model at temperature 1
(issue 25, part 4), through the offline LLM; a cut answer still says so.

Before the digit budget (engine/structured/digit_budget.py) 2 of these 12 seeds ran out of tokens inside a number.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from helpers.drone_command import DRONE_COMMAND, DRONE_MESSAGES
from nvllm.llm import LLM
from nvllm.sampling_params import SamplingParams, StructuredSpec

SEEDS = range(12)
BUDGET = 160


@pytest.fixture(scope="module")
def llm(smollm2: Path) -> LLM:
    return LLM(smollm2, max_num_seqs=len(SEEDS))


def drone(**params) -> SamplingParams:
    return SamplingParams(temperature=1.0, structured=StructuredSpec("json_schema", json.dumps(DRONE_COMMAND)),
                          **params)


@pytest.mark.smollm2
def test_every_seed_finishes_a_valid_drone_command(llm: LLM) -> None:
    outs = llm.chat([DRONE_MESSAGES] * len(SEEDS), [drone(seed=s, max_tokens=BUDGET) for s in SEEDS])
    for o in outs:
        assert o.finish_reason == "stop", o.text
        assert len(o.token_ids) <= BUDGET
        jsonschema.validate(json.loads(o.text), DRONE_COMMAND)
    assert len({o.text for o in outs}) > len(SEEDS) // 2        # really sampled


@pytest.mark.smollm2
def test_a_cut_answer_reports_length(llm: LLM) -> None:
    out = llm.chat([DRONE_MESSAGES], [drone(seed=0, max_tokens=8)])[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 8
    with pytest.raises(ValueError):
        json.loads(out.text)
