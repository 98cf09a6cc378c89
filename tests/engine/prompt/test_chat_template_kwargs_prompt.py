"""A chat prompt's chat_template_kwargs reach the template through engine/prompt.py (the tokens of Qwen3's empty
think block when enable_thinking is false), and a refusal names chat_template_kwargs."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.thinking_template import EMPTY_THINK, USER, make_thinking_qwen3
from nvllm.engine.prompt import prompt_ids
from nvllm.sampling_params import InvalidParameter
from nvllm.text.tokenizer import Tokenizer


def test_the_engine_prompt_takes_them_and_names_the_field(tiny_models: dict[str, Path],
                                                         tmp_path_factory: pytest.TempPathFactory):
    tok = Tokenizer.from_dir(make_thinking_qwen3(tiny_models, tmp_path_factory))
    _, plain = prompt_ids(tok, 1 << 20, {"messages": USER})
    field, off = prompt_ids(tok, 1 << 20, {"messages": USER, "chat_template_kwargs": {"enable_thinking": False}})
    assert field == "messages"
    assert off[:len(plain)] == plain and tok.decode(off[len(plain):], skip_special_tokens=False) == EMPTY_THINK
    with pytest.raises(InvalidParameter) as e:
        prompt_ids(tok, 1 << 20, {"messages": USER, "chat_template_kwargs": {"messages": 1}})
    assert e.value.field == "chat_template_kwargs" and str(e.value).startswith("chat_template_kwargs.messages")
    with pytest.raises(InvalidParameter) as e:       # not a chat prompt's key
        prompt_ids(tok, 1 << 20, {"prompt": "hi", "chat_template_kwargs": {}})
    assert e.value.field == "prompt"
