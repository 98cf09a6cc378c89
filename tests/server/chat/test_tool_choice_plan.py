"""The plan for each tool_choice (issue 17, item 4) and the grammar it gives: which format a chat template
calls for, "auto" refused where the format is unknown, a named function or "required" as a JSON schema (objects
closed), "none" unconstrained, the tagged <tool_call> format as a Lark grammar; bad tools and choices are 400s
naming the field; the finish reason calls give. The grammars are then run through llguidance with tiny-qwen3's
own tokenizer: text through for "auto", a started call held to the schema, forced calls exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from helpers.tool_call_cases import (
    NAMED,
    QWEN_TOOLS_TEMPLATE,
    TOOLS,
    WEATHER_PARAMS,
    constraint_text,
    make_qwen_tools,
    refused,
    smollm2_template,
    tool_plan,
)
from nvllm.server.chat.tool_calls import finish_reason
from nvllm.server.chat.tool_plan import plan_tools, tool_format


@pytest.fixture(scope="module")
def qwen_tools(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-qwen3 with the Qwen-style tool template (helpers/tool_call_cases.py)."""
    return make_qwen_tools(tiny_models, tmp_path_factory)


# ------------------------------------------------------------------------------------------ plan


class TestPlan:
    def test_format_is_known_from_the_template(self, smollm2: Path):
        assert tool_format(QWEN_TOOLS_TEMPLATE) == "tagged"
        assert tool_format(smollm2_template(smollm2)) is None
        assert tool_format(None) is None

    def test_auto_on_a_model_without_a_known_format_is_400_naming_tool_choice(self, smollm2: Path):
        template = smollm2_template(smollm2)
        refused(lambda: plan_tools(TOOLS, "auto", None, template), "tool_choice")
        refused(lambda: plan_tools(TOOLS, None, None, template), "tool_choice")   # auto is the default

    def test_named_constrains_to_that_function(self):
        plan = tool_plan(TOOLS, NAMED, None, None)
        assert plan.choice == "named" and plan.style == "json" and not plan.parallel
        schema = json.loads(constraint_text(plan))
        assert plan.constraint is not None and plan.constraint.kind == "json_schema"
        assert schema["properties"]["name"] == {"const": "get_weather"}
        assert schema["properties"]["arguments"] == WEATHER_PARAMS

    def test_objects_with_listed_properties_are_closed(self):
        open_params: dict[str, Any] = {"type": "object", "properties": {
            "city": {"type": "string"},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
            "extra": {"type": "object"},
            "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
            "both": {"allOf": [{"type": "object", "properties": {"a": {}}}]}}}
        tools: list[dict[str, Any]] = [{"type": "function", "function": {"name": "f", "parameters": open_params}}]
        args = json.loads(constraint_text(tool_plan(tools, "required", False, None)))["properties"]["arguments"]
        assert args["additionalProperties"] is False
        assert args["properties"]["where"]["additionalProperties"] is False
        assert "additionalProperties" not in args["properties"]["extra"]
        assert args["properties"]["tags"]["items"]["additionalProperties"] is False
        assert args["properties"]["both"] == open_params["properties"]["both"]
        assert open_params == tools[0]["function"]["parameters"] and "additionalProperties" not in open_params
        jsonschema.validate({"city": "x", "extra": {"any": 1}}, args)

    def test_required_is_any_tool_and_a_list_with_parallel_calls(self):
        plan = tool_plan(TOOLS, "required", None, None)
        schema = json.loads(constraint_text(plan))
        assert schema["type"] == "array" and schema["minItems"] == 1
        assert [s["properties"]["name"]["const"] for s in schema["items"]["anyOf"]] == ["get_weather", "get_time"]
        single = json.loads(constraint_text(tool_plan(TOOLS, "required", False, None)))
        assert "anyOf" in single

    def test_none_keeps_the_tools_in_the_prompt_without_a_constraint(self):
        plan = tool_plan(TOOLS, "none", None, None)
        assert plan.constraint is None and plan.tools == TOOLS and plan.style is None

    def test_tagged_plans_are_grammars(self):
        auto = tool_plan(TOOLS, "auto", None, QWEN_TOOLS_TEMPLATE)
        assert auto.constraint is not None
        assert auto.constraint.kind == "grammar" and "[lazy]" in constraint_text(auto)
        named = tool_plan(TOOLS, NAMED, None, QWEN_TOOLS_TEMPLATE)
        assert named.constraint is not None
        assert named.constraint.kind == "grammar" and "[lazy]" not in constraint_text(named)
        # The same tools give the same text, which the engine compiles once.
        assert tool_plan(TOOLS, "auto", None, QWEN_TOOLS_TEMPLATE).constraint == auto.constraint

    @pytest.mark.parametrize("tools, choice, parallel, param", [
        (None, "required", None, "tool_choice"),
        (TOOLS, "sometimes", None, "tool_choice"),
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, None, "tool_choice.function.name"),
        (TOOLS, {"type": "function"}, None, "tool_choice"),
        (TOOLS, "required", "yes", "parallel_tool_calls"),
        ("x", "required", None, "tools"),
        ([{"type": "function", "function": {"name": "a b"}}], "required", None, "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "a"}}] * 2, "required", None, "tools[1].function.name"),
        ([{"type": "function", "function": {"name": "a", "parameters": []}}], "required", None,
         "tools[0].function.parameters"),
        ([{"type": "function", "function": {"name": "a", "extra": 1}}], "required", None, "tools[0].function.extra"),
        ([{"type": "code_interpreter"}], "required", None, "tools[0].type"),
    ])
    def test_bad_requests_are_400_naming_the_field(self, tools, choice, parallel, param):
        refused(lambda: plan_tools(tools, choice, parallel, None), param)

    def test_finish_reason(self):
        assert finish_reason("stop", 1) == "tool_calls"
        assert finish_reason("stop", 0) == "stop"
        assert finish_reason("length", 1) == "length"



# ------------------------------------------------------------------------------------------ the grammar itself


def _matcher_accepts(folder: Path, grammar: str, text: str) -> bool:
    """Whether llguidance, with the model's own tokenizer, takes text as a complete answer of the grammar."""
    import llguidance
    from tokenizers import Tokenizer as Backend

    tok = llguidance.LLTokenizer(str(folder / "tokenizer.json"))
    matcher = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    ids = Backend.from_file(str(folder / "tokenizer.json")).encode(text).ids
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


class TestGrammar:
    CALL = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'

    def test_auto_lets_text_through_and_constrains_a_started_call(self, qwen_tools: Path):
        grammar = constraint_text(tool_plan(TOOLS, "auto", None, QWEN_TOOLS_TEMPLATE))
        assert _matcher_accepts(qwen_tools, grammar, "Hello, no call needed.")
        assert _matcher_accepts(qwen_tools, grammar, "Checking.\n" + self.CALL)
        assert _matcher_accepts(qwen_tools, grammar, self.CALL + "\n" + self.CALL)
        assert not _matcher_accepts(qwen_tools, grammar, '<tool_call>\n{"name":"rm_rf","arguments":{}}')
        assert not _matcher_accepts(qwen_tools, grammar, '<tool_call>\n{"name": "get_time", "arguments": {"z": 1}}')
        # The JSON is written as these models write it, with no room for padding.
        assert not _matcher_accepts(qwen_tools, grammar, self.CALL.replace(": ", ":"))
        assert not _matcher_accepts(qwen_tools, grammar, self.CALL.replace("{", "{ "))

    def test_auto_without_parallel_calls_takes_one(self, qwen_tools: Path):
        grammar = constraint_text(tool_plan(TOOLS, "auto", False, QWEN_TOOLS_TEMPLATE))
        assert _matcher_accepts(qwen_tools, grammar, "Checking.\n" + self.CALL + "\n")
        assert not _matcher_accepts(qwen_tools, grammar, self.CALL + "\n" + self.CALL)

    def test_forced_calls(self, qwen_tools: Path):
        named = constraint_text(tool_plan(TOOLS, {"type": "function", "function": {"name": "get_time"}}, None,
                                          QWEN_TOOLS_TEMPLATE))
        assert _matcher_accepts(qwen_tools, named, self.CALL)
        assert not _matcher_accepts(qwen_tools, named, "Sure. " + self.CALL)
        assert not _matcher_accepts(qwen_tools, named, self.CALL + "\n" + self.CALL)
        required = constraint_text(tool_plan(TOOLS, "required", None, QWEN_TOOLS_TEMPLATE))
        assert _matcher_accepts(qwen_tools, required, self.CALL + "\n" + self.CALL)

