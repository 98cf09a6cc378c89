"""Tools into the prompt (issue 17, item 4): a chat template that takes tools gets them, and past calls and
their results, as it expects; a template without them (SmolLM2's) gets them described in the system message
and past calls written as text; malformed tools and tool calls in messages are refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers.tool_call_cases import QWEN_TOOLS_TEMPLATE, TOOLS, make_qwen_tools, smollm2_template
from nvllm.text.chat_template import TOOLS_PREAMBLE, describe_tools, template_takes_tools
from nvllm.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def qwen_tools(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-qwen3 with the Qwen-style tool template (helpers/tool_call_cases.py)."""
    return make_qwen_tools(tiny_models, tmp_path_factory)


@pytest.fixture(scope="module")
def smol_tok(smollm2: Path) -> Tokenizer:
    return Tokenizer.from_dir(smollm2)


class TestPrompt:
    def test_template_takes_tools(self, smollm2: Path):
        assert template_takes_tools(QWEN_TOOLS_TEMPLATE)
        assert not template_takes_tools(smollm2_template(smollm2))
        assert not template_takes_tools(None)
        assert not template_takes_tools("{{ 'tools' }} {{ messages }}")   # the word, not the variable

    def test_tools_reach_a_template_that_takes_them(self, qwen_tools: Path):
        tok = Tokenizer.from_dir(qwen_tools)
        user = [{"role": "user", "content": "Weather in Paris?"}]
        text = tok.render_chat(user, tools=TOOLS)
        assert "<tools>\n" + json.dumps(TOOLS[0]) in text and json.dumps(TOOLS[1]) in text
        assert text.endswith("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")
        # Without tools the template renders plain ChatML, as the tiny models' own template does.
        assert tok.render_chat(user) == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                                         "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")

    def test_past_calls_and_results_reach_the_template(self, qwen_tools: Path):
        tok = Tokenizer.from_dir(qwen_tools)
        turns: list[dict[str, Any]]
        turns = [{"role": "user", "content": "Weather in Paris?"},
                 {"role": "assistant", "content": None, "tool_calls": [
                     {"id": "call_1", "type": "function",
                      "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
                 {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]
        text = tok.render_chat(turns, tools=TOOLS)
        # The arguments string is parsed, so the template writes it as JSON, not as a quoted string.
        assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
                '{"city": "Paris", "unit": "celsius"}}\n</tool_call><|im_end|>\n') in text
        assert "<tool_response>\n21 C\n</tool_response>" in text

    def test_a_template_without_tools_gets_them_in_the_system_message(self, smol_tok: Tokenizer):
        tok = smol_tok
        user = [{"role": "user", "content": "Weather in Paris?"}]
        text = tok.render_chat(user, tools=TOOLS)
        assert text.startswith("<|im_start|>system\n" + describe_tools(TOOLS) + "<|im_end|>\n")
        assert json.dumps(TOOLS[0]["function"]) in text and TOOLS_PREAMBLE in text
        merged = tok.render_chat([{"role": "system", "content": "Be brief."}] + user, tools=TOOLS)
        assert merged.startswith("<|im_start|>system\nBe brief.\n\n" + TOOLS_PREAMBLE)
        assert tok.render_chat(user) == tok.render_chat(user, tools=[])

    def test_past_calls_become_text_for_a_template_without_tools(self, smol_tok: Tokenizer):
        tok = smol_tok
        turns: list[dict[str, Any]]
        turns = [{"role": "user", "content": "Weather?"},
                 {"role": "assistant", "tool_calls": [
                     {"id": "c", "type": "function",
                      "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}]},
                 {"role": "tool", "tool_call_id": "c", "content": "12:00"}]
        text = tok.render_chat(turns, tools=TOOLS)
        assert '<|im_start|>assistant\n{"name": "get_time", "arguments": {"zone": "UTC"}}<|im_end|>' in text
        assert "<|im_start|>tool\n12:00<|im_end|>" in text
        # Without tools in this request the past call is still written, and nothing is described.
        bare = tok.render_chat(turns)
        assert '<|im_start|>assistant\n{"name": "get_time", "arguments": {"zone": "UTC"}}<|im_end|>' in bare
        assert TOOLS_PREAMBLE not in bare

    @pytest.mark.parametrize("tools, where", [
        ("x", "tools must be a list"),
        ([{"type": "function", "function": {"name": ""}}], "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "f", "parameters": 3}}], "tools[0].function.parameters"),
        ([{"type": "retrieval"}], "tools[0].type"),
    ])
    def test_bad_tools_are_refused_naming_the_field(self, smol_tok: Tokenizer, tools: Any, where: str):
        tok = smol_tok
        with pytest.raises(ValueError, match=where.replace("[", r"\[").replace("]", r"\]")):
            tok.render_chat([{"role": "user", "content": "x"}], tools=tools)

    def test_bad_tool_calls_in_messages_are_refused_naming_the_field(self, smol_tok: Tokenizer):
        tok = smol_tok
        with pytest.raises(ValueError, match=r"messages\[0\]\.tool_calls\[0\]\.function\.name"):
            tok.render_chat([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}])

