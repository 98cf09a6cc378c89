"""With a reasoning parser set, a constrained answer's grammar starts after the model writes </think>
(engine/structured/thinking.py): the thinking is not masked, the answer is; a prompt that already closed the thinking
(Qwen3's enable_thinking false) and an engine without a parser mask from the first token; speculation never
proposes past the end of thinking while the grammar waits."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.thinking_template import EMPTY_THINK, USER, make_think_tokens
from nvllm import LLM
from nvllm.config import load_settings
from nvllm.engine.assembly.factory import build_engine
from nvllm.engine.speculation.speculator import Speculator
from nvllm.engine.structured.thinking import prompt_ends_thinking, think_token_ids
from nvllm.sampling_params import SamplingParams, StructuredSpec

DIGITS = StructuredSpec("regex", "[0-9]{3}")


@pytest.fixture(scope="module")
def think_tokens(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_think_tokens(tiny_models, tmp_path_factory)


def engines(folder: Path) -> tuple[LLM, LLM]:
    """(with server.reasoning_parser qwen3, without)."""
    s = load_settings(overrides={"model": {"path": str(folder)}, "cache": {"num_blocks": 64},
                                 "scheduler": {"max_num_seqs": 4, "max_model_len": 512},
                                 "server": {"reasoning_parser": "qwen3"}})
    return LLM.from_engine(build_engine(s)), LLM(folder, num_blocks=64, max_num_seqs=4, max_model_len=512)


def test_prompt_scan():
    think = (7, 8)
    assert not prompt_ends_thinking([1, 2, 3], think)
    assert not prompt_ends_thinking([1, 7, 2], think)            # the template opened the thinking
    assert prompt_ends_thinking([1, 7, 2, 8, 3], think)          # and closed it (enable_thinking false)
    assert not prompt_ends_thinking([8, 1, 7, 2], think)         # an earlier turn's close does not count


def test_the_grammar_waits_for_the_end_of_thinking(think_tokens: Path):
    thinking, plain = engines(think_tokens)
    start, end = think_token_ids(thinking.tokenizer) or (None, None)
    assert start is not None and end is not None
    assert think_token_ids(plain.tokenizer) == (start, end) and plain.engine.think_tokens is None

    def text(llm: LLM, prompt, **kw) -> str:
        params = SamplingParams(max_tokens=120, structured=DIGITS, **kw)
        (out,) = llm.generate([prompt], params)
        return out.text

    chat = {"messages": USER}
    forced = {"logit_bias": {end: 100.0}}        # greedy writes </think> first unless a mask forbids it
    assert text(thinking, chat, temperature=0, **forced) == "</think>" + text(plain, chat, temperature=0)
    assert re.fullmatch("[0-9]{3}", text(plain, chat, temperature=0, **forced))
    # Sampled thinking of several tokens, not masked, then the answer under the grammar.
    said = text(thinking, chat, temperature=1.0, seed=3, logit_bias={end: 4.0})
    thought, _, answer = said.partition("</think>")
    assert re.fullmatch("[0-9]{3}", answer) and not re.fullmatch("[0-9]*", thought), said
    # The prompt closed the thinking (enable_thinking false): masked from the first token.
    closed = {"messages": USER, "chat_template_kwargs": {"enable_thinking": False}}
    assert EMPTY_THINK in thinking.tokenizer.render_chat(USER, template_kwargs={"enable_thinking": False})
    assert re.fullmatch("[0-9]{3}", text(thinking, closed, temperature=0, **forced))


def test_speculation_stops_before_the_end_of_thinking():
    waiting = SimpleNamespace(structured=None, structured_after_thinking=(9, object()))
    assert Speculator._cut(waiting, [1, 2, 9, 3]) == [1, 2]      # type: ignore[arg-type]
    assert Speculator._cut(waiting, [1, 2]) == [1, 2]            # type: ignore[arg-type]
    free = SimpleNamespace(structured=None, structured_after_thinking=None)
    assert Speculator._cut(free, [1, 9, 3]) == [1, 9, 3]         # type: ignore[arg-type]
