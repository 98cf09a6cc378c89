"""context_overflow "drop_oldest" on a chat longer than the context: whole turns dropped from the oldest on
(a turn starts at a user message, so a tool call goes with its result), the system messages and the last
turn kept, as few dropped as fit, the count reported; refused naming both lengths when even the last turn
does not fit, and by default ("error") with a hint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvllm import LLM, SamplingParams
from nvllm.engine.prompt import tokenize

MAX_MODEL_LEN = 256
SYSTEM = {"role": "system", "content": "You are the drone's assistant. Answer briefly."}


def turn(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Turn {i}: report the battery, the wind and the altitude now."},
            {"role": "assistant", "content": f"Reply {i}: battery fine, wind calm, altitude one hundred."}]


def tool_turn() -> list[dict[str, Any]]:
    call = {"id": "call_1", "type": "function", "function": {"name": "battery", "arguments": "{}"}}
    return [{"role": "user", "content": "Check the battery with the tool."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "battery 81 percent"},
            {"role": "assistant", "content": "The battery is at 81 percent."}]


LAST = {"role": "user", "content": "And now, should we land?"}


@pytest.fixture(scope="module")
def llm(tiny: Path) -> LLM:
    return LLM(tiny, num_blocks=64, max_num_seqs=4, max_model_len=MAX_MODEL_LEN)


def count(llm: LLM, messages: list[dict[str, Any]]) -> int:
    e = llm.engine
    return len(tokenize(e.tokenizer, e.model.config.vocab_size, {"messages": messages}).ids)


def greedy(**kw: Any) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, **kw)


def test_the_oldest_whole_turns_go_and_the_system_and_last_turn_stay(llm: LLM) -> None:
    middle = turn(0) + tool_turn() + turn(1) + turn(2) + turn(3) + turn(4)
    conversation = [SYSTEM, *middle, LAST]
    full = count(llm, conversation)
    assert full > MAX_MODEL_LEN, full
    got = llm.chat(conversation, greedy(context_overflow="drop_oldest"))[0]
    # The turns start at each user message; the fewest dropped that leave room for max_tokens.
    starts = [i for i, m in enumerate(middle) if m["role"] == "user"] + [len(middle)]
    room = MAX_MODEL_LEN - 8
    fits = [k for k in range(1, len(starts)) if count(llm, [SYSTEM, *middle[starts[k]:], LAST]) <= room]
    k = fits[0]
    kept = [SYSTEM, *middle[starts[k]:], LAST]
    assert count(llm, [SYSTEM, *middle[starts[k - 1]:], LAST]) > room   # one turn fewer would not fit
    assert got.prompt_tokens == count(llm, kept) and got.dropped_prompt_tokens == full - got.prompt_tokens
    want = llm.chat(kept, greedy())[0]
    assert got.token_ids == want.token_ids and want.dropped_prompt_tokens == 0


def test_a_tool_call_leaves_with_its_result(llm: LLM) -> None:
    middle = tool_turn() + turn(1) + turn(2) + turn(3) + turn(4)
    got = llm.chat([SYSTEM, *middle, LAST], greedy(context_overflow="drop_oldest"))[0]
    # The tool turn is the oldest: it goes whole (a template that checks call ids would refuse half of it).
    assert got.dropped_prompt_tokens >= count(llm, [SYSTEM, *tool_turn()]) - count(llm, [SYSTEM])


def test_a_chat_that_fits_is_untouched(llm: LLM) -> None:
    conversation = [SYSTEM, *turn(0), LAST]
    got = llm.chat(conversation, greedy(context_overflow="drop_oldest"))[0]
    assert got.dropped_prompt_tokens == 0 and got.prompt_tokens == count(llm, conversation)


def test_refused_naming_both_lengths(llm: LLM) -> None:
    long_last = {"role": "user", "content": " ".join(["battery wind altitude"] * 80)}
    with pytest.raises(ValueError, match=r"messages must be at most \d+ tokens .* max_model_len 256.* alone make \d+"):
        llm.chat([SYSTEM, *turn(0), long_last], greedy(context_overflow="drop_oldest"))
    conversation = [SYSTEM, *turn(0), *turn(1), *turn(2), *turn(3), *turn(4), LAST]
    with pytest.raises(ValueError, match=r"max_model_len 256 .*context_overflow 'drop_oldest'"):
        llm.chat(conversation, SamplingParams(temperature=0))
    with pytest.raises(ValueError, match="context_overflow must be 'error', 'drop_oldest' or unset"):
        llm.chat(conversation, greedy(context_overflow="drop_newest"))


def test_it_applies_to_chats_only(llm: LLM) -> None:
    ids = [(7 * i) % 400 + 3 for i in range(MAX_MODEL_LEN + 5)]
    with pytest.raises(ValueError, match="shorter than max_model_len 256"):
        llm.generate([{"prompt_token_ids": ids}], greedy(context_overflow="drop_oldest"))
