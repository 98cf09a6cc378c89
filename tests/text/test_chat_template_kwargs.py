"""chat_template_kwargs: a request's extra template variables reach the render (Qwen3's enable_thinking), and
ones that are not an object of names, or would replace the render's own variables, are refused naming the field."""

from __future__ import annotations

import pytest

from helpers.thinking_template import EMPTY_THINK, PROMPT, THINKING_TEMPLATE, USER
from nvllm.text.chat_template import compile_chat_template, render_chat_template

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}


def render(kwargs):
    return render_chat_template(compile_chat_template(THINKING_TEMPLATE), USER, True, SPECIAL,
                                template_kwargs=kwargs)


def test_enable_thinking_switches_the_empty_think_block():
    assert render(None) == PROMPT
    assert render({}) == PROMPT
    assert render({"enable_thinking": True}) == PROMPT
    assert render({"enable_thinking": False}) == PROMPT + EMPTY_THINK
    # Any other variable the template does not read changes nothing.
    assert render({"reasoning_effort": "low"}) == PROMPT


@pytest.mark.parametrize("kwargs, says", [
    ([1], "chat_template_kwargs must be an object, got list"),
    ({"messages": []}, "chat_template_kwargs.messages would override the chat template's own variable"),
    ({"add_generation_prompt": False}, "chat_template_kwargs.add_generation_prompt would override"),
    ({"tools": []}, "chat_template_kwargs.tools would override"),
    ({"bos_token": "x"}, "chat_template_kwargs.bos_token would override"),
    ({"raise_exception": 1}, "chat_template_kwargs.raise_exception would override"),
    ({"__class__": 1}, "names may not start with '_'"),
    ({"not a name": 1}, "chat_template_kwargs keys must be template variable names"),
])
def test_bad_kwargs_are_refused_naming_the_field(kwargs, says):
    with pytest.raises(ValueError, match="^chat_template_kwargs") as e:
        render(kwargs)
    assert says in str(e.value)
