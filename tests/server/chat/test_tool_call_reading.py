"""Reading tool calls back from the model's text (issue 17, item 4): whole answers in the json style (one call
or a list) and the tagged <tool_call> style (calls after text), cut-short calls left as text; and streamed, where
any split of the text into pieces gives the same content and calls as reading it whole, a call announced once
its name is known and its arguments streamed after."""

from __future__ import annotations

import random
from typing import Any

import pytest

from helpers.tool_call_cases import NAMED, QWEN_TOOLS_TEMPLATE, TOOLS, tool_plan
from nvllm.server.chat.tool_calls import ToolCallStream, read_tool_calls
from nvllm.server.chat.tool_plan import ToolPlan

JSON_PLAN = tool_plan(TOOLS, "required", None, None)
TAGGED_PLAN = tool_plan(TOOLS, "auto", None, QWEN_TOOLS_TEMPLATE)
WEATHER_ARGS = '{"city":"Paris","unit":"celsius"}'
TAGGED = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": ' + WEATHER_ARGS + '}\n</tool_call>\n'
          '<tool_call>\n{"name":"get_time","arguments":{"zone":"CET"}}\n</tool_call>')


class TestRead:
    def test_json_single_and_list(self):
        content, calls = read_tool_calls('{"name":"get_weather","arguments":' + WEATHER_ARGS + '}', JSON_PLAN)
        assert content is None and [(c.name, c.arguments) for c in calls] == [("get_weather", WEATHER_ARGS)]
        content, calls = read_tool_calls('[{"name":"get_time","arguments":{"zone":"a"}},'
                                         '{"name":"get_time","arguments":{"zone":"b"}}]', JSON_PLAN)
        assert [c.arguments for c in calls] == ['{"zone":"a"}', '{"zone":"b"}']
        assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)
        assert calls[0].to_dict()["function"] == {"name": "get_time", "arguments": '{"zone":"a"}'}

    def test_json_cut_short_is_text(self):
        text = '{"name":"get_weather","arguments":{"city":"Par'
        assert read_tool_calls(text, JSON_PLAN) == (text, [])

    def test_tagged_calls_and_content(self):
        content, calls = read_tool_calls(TAGGED, TAGGED_PLAN)
        assert content == "Let me check."
        assert [(c.name, c.arguments) for c in calls] == [("get_weather", WEATHER_ARGS), ("get_time", '{"zone":"CET"}')]

    def test_tagged_plain_text_and_a_half_call(self):
        assert read_tool_calls("Just text.\n", TAGGED_PLAN) == ("Just text.\n", [])
        half = 'Sure <tool_call>\n{"name": "get_weather", "argu'
        assert read_tool_calls(half, TAGGED_PLAN) == (half, [])


def _replay(plan: ToolPlan, text: str, pieces: list[str]) -> tuple[str | None, list[dict[str, Any]], list[dict]]:
    """Feed the pieces to a stream; (content, calls as OpenAI's clients assemble them, deltas)."""
    stream = ToolCallStream(plan)
    deltas: list[dict[str, Any]] = []
    for i, piece in enumerate(pieces):
        deltas += stream.feed(piece, final=i == len(pieces) - 1)
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas:
        content += d.get("content", "")
        for tc in d.get("tool_calls", []):
            slot = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
            if "id" in tc:
                assert slot["id"] is None and tc["type"] == "function"
                slot["id"], slot["name"] = tc["id"], tc["function"]["name"]
            slot["arguments"] += tc["function"]["arguments"]
    assert sorted(calls) == list(range(len(calls))) and stream.num_calls == len(calls)
    return content or None, [calls[i] for i in sorted(calls)], deltas


def _splits(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 30))))
    return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


class TestStream:
    @pytest.mark.parametrize("plan, text", [
        (TAGGED_PLAN, TAGGED),
        (TAGGED_PLAN, "No call here <tool but <tool_cal text.\n\n"),
        (TAGGED_PLAN, '<tool_call>\n{"name":"get_time","arguments":{"zone":"x}y\\"z"}}\n</tool_call>\n\nAfter.'),
        (JSON_PLAN, '[{"name":"get_weather","arguments":' + WEATHER_ARGS + '},{"name":"get_time","arguments":{}}]'),
        (JSON_PLAN, '{"name": "get_time", "arguments": {"zone": "[{,}]"}}'),
    ])
    def test_streamed_pieces_add_up_to_the_whole_answer(self, plan, text: str):
        content, calls = read_tool_calls(text, plan)
        expect = [(c.name, c.arguments) for c in calls]
        rng = random.Random(7)
        for pieces in [[text], list(text)] + [_splits(text, rng) for _ in range(40)]:
            got_content, got_calls, deltas = _replay(plan, text, pieces)
            assert got_content == content, pieces
            assert [(c["name"], c["arguments"]) for c in got_calls] == expect, pieces

    def test_a_call_is_announced_once_its_name_is_known_then_its_arguments_stream(self):
        text = '{"name":"get_weather","arguments":' + WEATHER_ARGS + '}'
        stream = ToolCallStream(tool_plan(TOOLS, NAMED, None, None))
        assert stream.feed('{"name":"get_wea') == []
        first = stream.feed('ther","arguments":{"ci')
        assert first[0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
        assert first[1]["tool_calls"][0] == {"index": 0, "function": {"arguments": '{"ci'}}
        rest = stream.feed(text[len('{"name":"get_weather","arguments":{"ci'):], final=True)
        assert "".join(d["tool_calls"][0]["function"]["arguments"] for d in rest) == WEATHER_ARGS[4:]

    def test_no_tools_passes_text_through(self):
        plan = tool_plan(TOOLS, "none", None, None)
        stream = ToolCallStream(plan)
        assert stream.feed("<tool_call>hi") == [{"content": "<tool_call>hi"}]

