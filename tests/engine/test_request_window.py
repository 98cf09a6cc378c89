"""A request's own windows (what Ollama's repeat_last_n and num_ctx ask for): penalty_last_n puts every penalty
over the last N tokens of prompt and output together (0: no penalty at all, and the plain greedy step again),
and context_limit bounds prompt and answer within max_model_len (the answer's room, the refusal naming it,
drop_oldest fitting the chat within it)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from nvllm import LLM, SamplingParams
from nvllm.engine.prompt import tokenize
from nvllm.engine.sampling_rows import plain_greedy, sampling_batch
from nvllm.model.sampling.penalties import apply
from nvllm.sampling_params import InvalidParameter

PROMPT = [10, 11, 12, 13]
OUTPUT = [20, 21]
VOCAB = 32


def row(outputs: list[int] = OUTPUT, ahead: tuple[int, ...] = (), **params: Any) -> tuple:
    seq = SimpleNamespace(params=SamplingParams(**{"temperature": 0.0, **params}).resolve(), structured=None,
                          num_output_tokens=len(outputs), output_token_ids=list(outputs),
                          prompt_array=np.asarray(PROMPT, np.int64), generator=np.random.default_rng(0),
                          eos_token_ids=frozenset({2}))
    return seq, list(ahead)


@pytest.mark.parametrize(("window", "prompt", "output"), [
    (None, PROMPT, OUTPUT),                       # vLLM's split: repetition over both, the others over the output
    (1, [], [21]), (2, [], OUTPUT), (3, [], [13, *OUTPUT]), (6, [], PROMPT + OUTPUT), (50, [], PROMPT + OUTPUT)])
def test_the_window_is_the_last_tokens_of_prompt_and_output(window: int | None, prompt: list[int],
                                                             output: list[int]) -> None:
    batch = sampling_batch([row(repetition_penalty=1.5, penalty_last_n=window)])
    assert batch.prompt_token_ids[0].tolist() == prompt
    assert batch.output_token_ids[0].tolist() == output


def test_proposed_tokens_count_inside_the_window() -> None:
    batch = sampling_batch([row(ahead=(22, 23), presence_penalty=1.0, penalty_last_n=3)])
    assert batch.output_token_ids[0].tolist() == [21, 22, 23]


def test_penalties_fall_on_the_window_alone() -> None:
    """A token seen only before the window keeps its logit; one inside it is penalised by every penalty."""
    logits = np.full((1, VOCAB), 2.0, np.float32)
    cases: list[dict[str, Any]] = [{"repetition_penalty": 2.0}, {"presence_penalty": 1.0}, {"frequency_penalty": 1.0}]
    for params in cases:
        out, _ = apply(logits, sampling_batch([row(penalty_last_n=3, **params)]))
        assert out[0, 10] == 2.0 and out[0, 12] == 2.0       # the prompt's older tokens: outside
        assert out[0, 13] < 2.0 and out[0, 21] < 2.0         # the prompt's last and the output: inside
        whole, _ = apply(logits, sampling_batch([row(penalty_last_n=None, **params)]))
        if "repetition_penalty" in params:
            assert whole[0, 10] < 2.0                          # vLLM's: the whole prompt
        else:
            assert whole[0, 13] == 2.0 and whole[0, 21] < 2.0  # vLLM's: the output alone


def test_a_window_of_none_applies_no_penalty_and_the_step_stays_plain() -> None:
    off = row(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.5, penalty_last_n=0)
    assert plain_greedy([row(), off])
    batch = sampling_batch([off])
    assert batch.repetition_penalty[0] == 1.0 and batch.presence_penalty[0] == 0.0
    assert batch.frequency_penalty[0] == 0.0 and batch.output_token_ids[0].size == 0
    assert not plain_greedy([row(repetition_penalty=1.3, penalty_last_n=4)])
    assert plain_greedy([row(penalty_last_n=4)])                # a window with no penalty to apply


@pytest.mark.parametrize(("field", "value"), [("penalty_last_n", -1), ("penalty_last_n", 1.5),
                                              ("context_limit", 0), ("context_limit", True)])
def test_out_of_range_windows_are_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(InvalidParameter) as e:
        SamplingParams(**{field: value}).resolve()
    assert e.value.field == field and str(e.value).startswith(field)


# -- context_limit on a real engine ------------------------------------------------------------------

MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def llm(tiny: Path) -> LLM:
    return LLM(tiny, num_blocks=64, max_num_seqs=4, max_model_len=MAX_MODEL_LEN)


def count(llm: LLM, messages: list[dict[str, Any]]) -> int:
    e = llm.engine
    return len(tokenize(e.tokenizer, e.model.config.vocab_size, {"messages": messages}).ids)


def test_the_answer_fills_the_requests_context_not_the_models(llm: LLM) -> None:
    messages = [{"role": "user", "content": "Count to a hundred."}]
    n = count(llm, messages)
    out = llm.chat(messages, SamplingParams(temperature=0, ignore_eos=True, context_limit=n + 5))[0]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    # a limit past max_model_len changes nothing: the model's bounds it
    wide = llm.chat(messages, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, context_limit=10 ** 6))[0]
    assert wide.token_ids == out.token_ids


def test_a_prompt_past_the_limit_is_refused_naming_it_or_its_oldest_turns_dropped(llm: LLM) -> None:
    turns: list[dict[str, Any]] = []
    for i in range(3):
        turns += [{"role": "user", "content": f"Turn {i}: report the battery and the wind."},
                  {"role": "assistant", "content": f"Reply {i}: battery fine, wind calm."}]
    chat = [*turns, {"role": "user", "content": "Land now?"}]
    full = count(llm, chat)
    limit = full - 10
    assert full < MAX_MODEL_LEN
    with pytest.raises(InvalidParameter) as e:
        llm.chat(chat, SamplingParams(temperature=0, max_tokens=4, context_limit=limit))
    assert e.value.field == "messages" and f"context_limit {limit}" in str(e.value)
    with pytest.raises(InvalidParameter) as e:
        llm.chat(chat[-1:], SamplingParams(temperature=0, max_tokens=limit, context_limit=limit))
    assert e.value.field == "max_tokens" and f"exceeds context_limit {limit}" in str(e.value)
    out = llm.chat(chat, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, context_limit=limit,
                                        context_overflow="drop_oldest"))[0]
    assert out.dropped_prompt_tokens > 0 and out.prompt_tokens + 4 <= limit
