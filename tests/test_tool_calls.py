"""Tool calls and structured output on the OpenAI API (issue 17, items 4 and 5).

Unit tests of the pieces (tools into the prompt, the plan for each tool_choice, reading calls back whole and
streamed, response_format mapping), then the real engine: SmolLM2 with a named and a required tool choice
(every call's arguments valid under the schema, checked with jsonschema), response_format json_schema, and
a tiny Qwen3 with a tool-taking template for "auto" (random weights: the format path, forced by a grammar).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from nvllm.server.http.errors import ApiError
from nvllm.server.http.response_format import parse_constraint
from nvllm.server.http.tool_calls import ToolCallStream, finish_reason, read_tool_calls
from nvllm.server.http.tool_plan import plan_tools, tool_format
from nvllm.text.chat_template import TOOLS_PREAMBLE, describe_tools, template_takes_tools
from nvllm.text.tokenizer import Tokenizer

WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMS = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
               "required": ["zone"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a zone",
                                      "parameters": TIME_PARAMS}},
]
DAY_PARAMS = {"type": "object", "properties": {}, "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS, "get_day": DAY_PARAMS}
# Short tools for the tiny Qwen model, whose 512-token context and small vocabulary leave little room.
SHORT_TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMS}},
               {"type": "function", "function": {"name": "get_day"}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}

# A Qwen2.5-style chat template that takes tools (the same text as the tiny models' ChatML without them):
# tools listed in the system message, calls and their results in <tool_call> / <tool_response> tags.
QWEN_TOOLS_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nFunction signatures, one per line:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nTo call a function, write:\\n<tool_call>\\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant' }}{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' "
    "+ (call.function.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def qwen_tools(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-qwen3 with the Qwen-style tool template above."""
    folder = tmp_path_factory.mktemp("qwen-tools") / "tiny-qwen3-tools"
    shutil.copytree(tiny_models["tiny-qwen3"], folder)
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = QWEN_TOOLS_TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module")
def qwen_tokens(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-llama with the tool template and, as real Qwen2.5/Qwen3 tokenizers have them, <tool_call> and
    </tool_call> as added tokens that are not special (text to the detokenizer); two embedding rows more."""
    import numpy as np
    from safetensors.numpy import load_file, save_file
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as Backend

    folder = tmp_path_factory.mktemp("qwen-tokens") / "tiny-tool-tokens"
    shutil.copytree(tiny_models["tiny-llama"], folder)
    backend = Backend.from_file(str(folder / "tokenizer.json"))
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<tool_call>", "</tool_call>")])
    backend.save(str(folder / "tokenizer.json"))
    for name, changes in (("tokenizer_config.json", {"chat_template": QWEN_TOOLS_TEMPLATE}),
                          ("config.json", {"vocab_size": 514, "max_position_embeddings": 1024})):
        cfg = json.loads((folder / name).read_text())
        cfg.update(changes)
        (folder / name).write_text(json.dumps(cfg))
    weights = load_file(str(folder / "model.safetensors"))
    rows = np.random.default_rng(0).normal(0, 0.1, (2, 64)).astype(np.float32)
    for key in ("lm_head.weight", "model.embed_tokens.weight"):
        weights[key] = np.concatenate([weights[key], rows])
    save_file(weights, str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def smol_tok(smollm2: Path) -> Tokenizer:
    return Tokenizer.from_dir(smollm2)


def smollm2_template(smollm2: Path) -> str:
    return json.loads((smollm2 / "tokenizer_config.json").read_text())["chat_template"]


def refused(call, param: str) -> ApiError:
    with pytest.raises(ApiError) as e:
        call()
    assert e.value.status == 400 and e.value.param == param, (e.value.param, e.value.message)
    return e.value


# ------------------------------------------------------------------------------------------ prompt


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
        turns = [{"role": "user", "content": "Weather?"},
                 {"role": "assistant", "tool_calls": [
                     {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}]},
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
        plan = plan_tools(TOOLS, NAMED, None, None)
        assert plan.choice == "named" and plan.style == "json" and not plan.parallel
        schema = json.loads(plan.constraint.value)
        assert plan.constraint.kind == "json_schema"
        assert schema["properties"]["name"] == {"const": "get_weather"}
        assert schema["properties"]["arguments"] == WEATHER_PARAMS

    def test_objects_with_listed_properties_are_closed(self):
        open_params = {"type": "object", "properties": {
            "city": {"type": "string"},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
            "extra": {"type": "object"},
            "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
            "both": {"allOf": [{"type": "object", "properties": {"a": {}}}]}}}
        tools = [{"type": "function", "function": {"name": "f", "parameters": open_params}}]
        args = json.loads(plan_tools(tools, "required", False, None).constraint.value)["properties"]["arguments"]
        assert args["additionalProperties"] is False
        assert args["properties"]["where"]["additionalProperties"] is False
        assert "additionalProperties" not in args["properties"]["extra"]
        assert args["properties"]["tags"]["items"]["additionalProperties"] is False
        assert args["properties"]["both"] == open_params["properties"]["both"]
        assert open_params == tools[0]["function"]["parameters"] and "additionalProperties" not in open_params
        jsonschema.validate({"city": "x", "extra": {"any": 1}}, args)

    def test_required_is_any_tool_and_a_list_with_parallel_calls(self):
        plan = plan_tools(TOOLS, "required", None, None)
        schema = json.loads(plan.constraint.value)
        assert schema["type"] == "array" and schema["minItems"] == 1
        assert [s["properties"]["name"]["const"] for s in schema["items"]["anyOf"]] == ["get_weather", "get_time"]
        single = json.loads(plan_tools(TOOLS, "required", False, None).constraint.value)
        assert "anyOf" in single

    def test_none_keeps_the_tools_in_the_prompt_without_a_constraint(self):
        plan = plan_tools(TOOLS, "none", None, None)
        assert plan.constraint is None and plan.tools == TOOLS and plan.style is None

    def test_tagged_plans_are_grammars(self):
        auto = plan_tools(TOOLS, "auto", None, QWEN_TOOLS_TEMPLATE)
        assert auto.constraint.kind == "grammar" and "[lazy]" in auto.constraint.value
        named = plan_tools(TOOLS, NAMED, None, QWEN_TOOLS_TEMPLATE)
        assert named.constraint.kind == "grammar" and "[lazy]" not in named.constraint.value
        # The same tools give the same text, which the engine compiles once.
        assert plan_tools(TOOLS, "auto", None, QWEN_TOOLS_TEMPLATE).constraint == auto.constraint

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


# ------------------------------------------------------------------------------------------ reading


JSON_PLAN = plan_tools(TOOLS, "required", None, None)
TAGGED_PLAN = plan_tools(TOOLS, "auto", None, QWEN_TOOLS_TEMPLATE)
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


def _replay(plan, text: str, pieces: list[str]) -> tuple[str | None, list[dict[str, Any]], list[dict]]:
    """Feed the pieces to a stream; (content, calls as OpenAI's clients assemble them, deltas)."""
    stream = ToolCallStream(plan)
    deltas: list[dict[str, Any]] = []
    for i, piece in enumerate(pieces):
        deltas += stream.feed(piece, final=i == len(pieces) - 1)
    content, calls = "", {}
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
        stream = ToolCallStream(plan_tools(TOOLS, NAMED, None, None))
        assert stream.feed('{"name":"get_wea') == []
        first = stream.feed('ther","arguments":{"ci')
        assert first[0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
        assert first[1]["tool_calls"][0] == {"index": 0, "function": {"arguments": '{"ci'}}
        rest = stream.feed(text[len('{"name":"get_weather","arguments":{"ci'):], final=True)
        assert "".join(d["tool_calls"][0]["function"]["arguments"] for d in rest) == WEATHER_ARGS[4:]

    def test_no_tools_passes_text_through(self):
        plan = plan_tools(TOOLS, "none", None, None)
        stream = ToolCallStream(plan)
        assert stream.feed("<tool_call>hi") == [{"content": "<tool_call>hi"}]


# ------------------------------------------------------------------------------------------ response_format


class TestResponseFormat:
    def test_mapping(self):
        assert parse_constraint({}) is None
        assert parse_constraint({"response_format": {"type": "text"}}) is None
        c = parse_constraint({"response_format": {"type": "json_object"}})
        assert c.spec.kind == "json_object" and c.param == "response_format"
        c = parse_constraint({"response_format": {"type": "json_schema", "json_schema": {
            "name": "w", "schema": WEATHER_PARAMS, "strict": True}}})
        assert c.spec.kind == "json_schema" and json.loads(c.spec.value) == WEATHER_PARAMS
        assert c.param == "response_format.json_schema.schema"
        c = parse_constraint({"structured_outputs": {"choice": ["yes", "no"]}})
        assert c.spec.kind == "choice" and tuple(c.spec.value) == ("yes", "no")
        assert c.param == "structured_outputs.choice"
        c = parse_constraint({"structured_outputs": {"json": json.dumps(TIME_PARAMS)}})
        assert c.spec.kind == "json_schema" and json.loads(c.spec.value) == TIME_PARAMS
        assert parse_constraint({"structured_outputs": {"regex": "[0-9]+"}}).spec.kind == "regex"
        assert parse_constraint({"structured_outputs": {"grammar": 'start: "a"'}}).spec.kind == "grammar"
        assert parse_constraint({"structured_outputs": {"json_object": True}}).spec.kind == "json_object"

    @pytest.mark.parametrize("body, param", [
        ({"response_format": "json"}, "response_format"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
         "response_format.json_schema.name"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}},
         "response_format.json_schema.schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": 1}}},
         "response_format.json_schema.strict"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
        ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag"),
        ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "structured_outputs"),
    ])
    def test_bad_shapes_are_400_naming_the_field(self, body, param):
        refused(lambda: parse_constraint(body), param)


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
        grammar = plan_tools(TOOLS, "auto", None, QWEN_TOOLS_TEMPLATE).constraint.value
        assert _matcher_accepts(qwen_tools, grammar, "Hello, no call needed.")
        assert _matcher_accepts(qwen_tools, grammar, "Checking.\n" + self.CALL)
        assert _matcher_accepts(qwen_tools, grammar, self.CALL + "\n" + self.CALL)
        assert not _matcher_accepts(qwen_tools, grammar, '<tool_call>\n{"name":"rm_rf","arguments":{}}')
        assert not _matcher_accepts(qwen_tools, grammar, '<tool_call>\n{"name": "get_time", "arguments": {"z": 1}}')
        # The JSON is written as these models write it, with no room for padding.
        assert not _matcher_accepts(qwen_tools, grammar, self.CALL.replace(": ", ":"))
        assert not _matcher_accepts(qwen_tools, grammar, self.CALL.replace("{", "{ "))

    def test_auto_without_parallel_calls_takes_one(self, qwen_tools: Path):
        grammar = plan_tools(TOOLS, "auto", False, QWEN_TOOLS_TEMPLATE).constraint.value
        assert _matcher_accepts(qwen_tools, grammar, "Checking.\n" + self.CALL + "\n")
        assert not _matcher_accepts(qwen_tools, grammar, self.CALL + "\n" + self.CALL)

    def test_forced_calls(self, qwen_tools: Path):
        named = plan_tools(TOOLS, {"type": "function", "function": {"name": "get_time"}}, None,
                           QWEN_TOOLS_TEMPLATE).constraint.value
        assert _matcher_accepts(qwen_tools, named, self.CALL)
        assert not _matcher_accepts(qwen_tools, named, "Sure. " + self.CALL)
        assert not _matcher_accepts(qwen_tools, named, self.CALL + "\n" + self.CALL)
        required = plan_tools(TOOLS, "required", None, QWEN_TOOLS_TEMPLATE).constraint.value
        assert _matcher_accepts(qwen_tools, required, self.CALL + "\n" + self.CALL)


# ------------------------------------------------------------------------------------------ the real engine, in process


def serve_app(folder: Path, model_name: str, requests: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """POST each body to the HTTP app over a started engine for the model; the responses, in order."""
    import asyncio

    import httpx2 as httpx
    from grpc_health.v1._async import HealthServicer

    from nvllm import LLM
    from nvllm.engine.async_engine import AsyncEngine
    from nvllm.server.http.app import OpenAIApi
    from nvllm.server.state import DaemonState

    engine = LLM(folder, num_blocks=128, max_num_seqs=4, max_model_len=1024).engine

    async def main() -> list[Any]:
        ae = AsyncEngine(engine)
        ae.start()
        state = DaemonState(model_name, HealthServicer(), 64, 4, 1 << 20)
        await state.set_ready(ae, None)
        api = OpenAIApi(state, None, 1 << 20, metrics=state.metrics)
        transport = httpx.ASGITransport(app=api.app(), client=("127.0.0.1", 5000))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://nvllm", timeout=120) as client:
                return [await client.post(path, json=body) for path, body in requests]
        finally:
            ae.shutdown()
    out = asyncio.run(main())
    bm = engine.block_manager
    assert len(bm.free_ids) + bm.num_cached_blocks == bm.num_blocks
    return out


def sse(response: Any) -> list[dict[str, Any]]:
    datas = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
    assert datas and datas[-1] == "[DONE]", response.text[-300:]
    return [json.loads(d) for d in datas[:-1]]


def assemble(chunks: list[dict[str, Any]]) -> tuple[str, list[dict[str, str]], str]:
    """(content, calls, finish_reason) as a client puts a streamed choice together."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
                slot["id"] += tc.get("id") or ""
                slot["name"] += (tc.get("function") or {}).get("name") or ""
                slot["arguments"] += (tc.get("function") or {}).get("arguments") or ""
            finish = choice["finish_reason"] or finish
    return content, [calls[i] for i in sorted(calls)], finish


def check_calls(calls: list[dict[str, Any]], names: set[str]) -> None:
    assert calls
    for call in calls:
        fn = call["function"] if "function" in call else call
        assert fn["name"] in names
        jsonschema.validate(json.loads(fn["arguments"]), SCHEMAS[fn["name"]])
        assert call["id"].startswith("call_")


class TestQwenTemplateModel:
    """tiny-qwen3 (random weights) with a tool-taking template: the <tool_call> path end to end."""

    def test_tool_choices_end_to_end(self, qwen_tools: Path):
        user = [{"role": "user", "content": "What is the time in UTC?"}]
        base = {"messages": user, "tools": SHORT_TOOLS, "temperature": 1.0, "max_tokens": 100}
        named = {"type": "function", "function": {"name": "get_time"}}
        bodies = [{**base, "tool_choice": named, "seed": s} for s in range(3)]
        bodies += [{**base, "tool_choice": "required", "seed": 10, "parallel_tool_calls": False}]
        bodies += [{**base, "tool_choice": named, "seed": 20, "stream": True}]
        bodies += [{**base, "tool_choice": "auto", "seed": s} for s in range(30, 33)]
        bodies += [{**base, "tool_choice": "auto", "seed": 40, "stream": True}]
        turns = user + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
        bodies += [{**base, "messages": turns, "tool_choice": "none", "max_tokens": 8}]
        requests = [("/v1/chat/completions", b) for b in bodies]
        requests.append(("/v1/completions", {"prompt": "The answer is", "max_tokens": 10, "seed": 1,
                                             "structured_outputs": {"regex": "[0-9]{3}"}}))
        requests.append(("/v1/chat/completions", {**base, "tool_choice": named, "seed": 50, "n": 2, "stream": True}))
        rs = serve_app(qwen_tools, "tiny-qwen3", requests)
        assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
        for r in rs[:4]:
            (choice,) = r.json()["choices"]
            assert choice["finish_reason"] == "tool_calls", choice
            check_calls(choice["message"]["tool_calls"], {"get_time"} if r is not rs[3] else set(SCHEMAS))
            assert choice["message"]["content"] is None
        assert len(rs[3].json()["choices"][0]["message"]["tool_calls"]) == 1
        content, calls, finish = assemble(sse(rs[4]))
        assert finish == "tool_calls" and content == "" and len(calls) == 1
        check_calls(calls, {"get_time"})
        # auto: text, or calls whose arguments hold (the weights are random: either may come).
        for r in rs[5:8]:
            (choice,) = r.json()["choices"]
            if choice["message"]["tool_calls"]:
                check_calls(choice["message"]["tool_calls"], set(SCHEMAS))
                assert choice["finish_reason"] == "tool_calls"
            else:
                assert choice["finish_reason"] in ("stop", "length")
        content, calls, finish = assemble(sse(rs[8]))
        if calls:
            check_calls(calls, set(SCHEMAS))
        # A conversation carried on after a call: "none" answers in text, the tools still in the prompt.
        message = rs[9].json()["choices"][0]["message"]
        assert "tool_calls" not in message and isinstance(message["content"], str)
        assert rs[9].json()["usage"]["prompt_tokens"] > rs[0].json()["usage"]["prompt_tokens"]
        # /v1/completions takes the structured_outputs extra too.
        assert re.fullmatch("[0-9]{3}", rs[10].json()["choices"][0]["text"])
        # n choices each get their own calls (and ids).
        chunks = sse(rs[11])
        both = [assemble([{**c, "choices": [x for x in c["choices"] if x["index"] == i]} for c in chunks])
                for i in range(2)]
        assert [finish for _, _, finish in both] == ["tool_calls"] * 2
        for _, calls, _ in both:
            check_calls(calls, {"get_time"})
        assert both[0][1][0]["id"] != both[1][1][0]["id"]


class TestToolTokens:
    def test_tool_call_tags_as_single_tokens(self, qwen_tokens: Path):
        """A Qwen-like tokenizer writes <tool_call> as one token: forced and auto calls still work."""
        user = [{"role": "user", "content": "time?"}]
        base = {"messages": user, "tools": SHORT_TOOLS, "temperature": 1.0, "max_tokens": 100}
        named = {"type": "function", "function": {"name": "get_time"}}
        bodies = [{**base, "tool_choice": named, "seed": 1}, {**base, "tool_choice": "required", "seed": 2},
                  {**base, "tool_choice": named, "seed": 3, "stream": True},
                  {**base, "tool_choice": "auto", "seed": 4}]
        rs = serve_app(qwen_tokens, "tiny-tool-tokens", [("/v1/chat/completions", b) for b in bodies])
        assert [r.status_code for r in rs] == [200] * 4, [r.text[:300] for r in rs]
        for r in rs[:2]:
            (choice,) = r.json()["choices"]
            assert choice["finish_reason"] == "tool_calls", choice
            check_calls(choice["message"]["tool_calls"], set(SCHEMAS))
        content, calls, finish = assemble(sse(rs[2]))
        assert finish == "tool_calls" and len(calls) == 1
        check_calls(calls, {"get_time"})

    def test_the_single_tag_token_is_allowed(self, qwen_tokens: Path):
        """The model may write <tool_call> as the one token it was trained on, in auto and forced calls."""
        from nvllm import LLM

        engine = LLM(qwen_tokens, num_blocks=64, max_num_seqs=2, max_model_len=512).engine
        tag = engine.tokenizer.encode("<tool_call>", add_special_tokens=False)
        assert tag == [512]
        for choice in ("auto", "required"):
            matcher = engine.structured.matcher(plan_tools(SHORT_TOOLS, choice, None, QWEN_TOOLS_TEMPLATE).constraint)
            if choice == "auto":
                assert matcher.consume_tokens(engine.tokenizer.encode("Hi. ", add_special_tokens=False))
            bits = engine.structured.fill([matcher])
            assert (int(bits[0, 512 // 32]) >> (512 % 32)) & 1, choice


class TestSmolLM2Quick:
    def test_400s_name_the_field_and_forced_calls_hold(self, smollm2: Path):
        """The quick lane's look at the default model: every refusal, one named call, one streamed required."""
        user = [{"role": "user", "content": "Hi"}]
        bad_schema = {"type": "object", "properties": {"a": {"type": "nonsense"}}}
        bodies = [
            {"messages": user, "tools": TOOLS, "tool_choice": "auto"},
            {"messages": user, "tools": TOOLS},
            {"messages": user, "max_tokens": 4,
             "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": bad_schema}}},
            {"messages": user, "max_tokens": 4, "structured_outputs": {"regex": "(unclosed"}},
            {"messages": user, "tools": [{"type": "function", "function": {"name": "f", "parameters": bad_schema}}],
             "tool_choice": "required", "max_tokens": 4},
            {"messages": user, "tools": TOOLS, "tool_choice": "required",
             "response_format": {"type": "json_object"}},
            {"messages": user, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            {"messages": WEATHER_USER, "tools": TOOLS, "tool_choice": NAMED, "temperature": 1.0, "seed": 1,
             "max_tokens": 200},
            {"messages": WEATHER_USER, "tools": TOOLS, "tool_choice": "required", "temperature": 1.0, "seed": 2,
             "max_tokens": 200, "stream": True},
        ]
        rs = serve_app(smollm2, "smollm2", [("/v1/chat/completions", b) for b in bodies])
        params = [r.json()["error"]["param"] if r.status_code == 400 else r.status_code for r in rs]
        assert params == ["tool_choice", "tool_choice", "response_format.json_schema.schema",
                          "structured_outputs.regex", "tools", "response_format", "tool_choice.function.name",
                          200, 200]
        assert "tool_choice" in rs[0].json()["error"]["message"]
        assert "nonsense" in rs[2].json()["error"]["message"]     # the reason the schema does not compile
        assert rs[4].json()["error"]["message"].startswith("tools: a function's parameters schema cannot be used")
        assert "nonsense" in rs[4].json()["error"]["message"]
        (choice,) = rs[-2].json()["choices"]
        assert choice["finish_reason"] == "tool_calls"
        check_calls(choice["message"]["tool_calls"], {"get_weather"})
        content, calls, finish = assemble(sse(rs[-1]))
        assert finish == "tool_calls" and content == ""
        check_calls(calls, set(SCHEMAS))


# ------------------------------------------------------------------------------------------ SmolLM2, the default model


WEATHER_USER = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.mark.slow
class TestSmolLM2:
    """The default model, which has no tool template: named and required choices still give valid calls."""

    SEEDS = range(6)

    def test_named_and_required_tool_choice_give_valid_calls(self, smollm2: Path):
        base = {"messages": WEATHER_USER, "tools": TOOLS, "temperature": 1.0, "max_tokens": 200}
        bodies = [{**base, "tool_choice": NAMED, "seed": s} for s in self.SEEDS]
        bodies += [{**base, "tool_choice": "required", "seed": s, "parallel_tool_calls": False} for s in self.SEEDS]
        bodies += [{**base, "tool_choice": "required", "seed": 100}]
        bodies += [{**base, "tool_choice": NAMED, "seed": 101, "stream": True}]
        rs = serve_app(smollm2, "smollm2", [("/v1/chat/completions", b) for b in bodies])
        n = len(self.SEEDS)
        for i, r in enumerate(rs[:-1]):
            assert r.status_code == 200, r.text
            (choice,) = r.json()["choices"]
            assert choice["finish_reason"] == "tool_calls", choice
            calls = choice["message"]["tool_calls"]
            check_calls(calls, {"get_weather"} if i < n else set(SCHEMAS))
            if i < 2 * n:
                assert len(calls) == 1
        content, calls, finish = assemble(sse(rs[-1]))
        assert finish == "tool_calls" and content == "" and len(calls) == 1
        check_calls(calls, {"get_weather"})

    def test_response_format_json_schema(self, smollm2: Path):
        schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 20},
                                                    "count": {"type": "integer", "minimum": 0, "maximum": 9}},
                  "required": ["colour", "count"], "additionalProperties": False}
        rf = {"type": "json_schema", "json_schema": {"name": "pick", "schema": schema, "strict": True}}
        user = [{"role": "user", "content": "Pick a colour and a count, as JSON."}]
        bodies = [{"messages": user, "response_format": rf, "temperature": 1.0, "max_tokens": 60, "seed": s}
                  for s in self.SEEDS]
        bodies.append({"messages": user, "structured_outputs": {"choice": ["red", "green"]}, "seed": 3})
        bodies.append({"messages": user, "response_format": {"type": "json_object"}, "temperature": 0,
                       "max_tokens": 60})
        rs = serve_app(smollm2, "smollm2", [("/v1/chat/completions", b) for b in bodies])
        for r in rs[:len(self.SEEDS)]:
            (choice,) = r.json()["choices"]
            assert choice["finish_reason"] == "stop", choice
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        assert rs[-2].json()["choices"][0]["message"]["content"] in ("red", "green")
        if rs[-1].json()["choices"][0]["finish_reason"] == "stop":
            assert isinstance(json.loads(rs[-1].json()["choices"][0]["message"]["content"]), dict)


# ------------------------------------------------------------------------------------------ the live daemon


@pytest.mark.slow
def test_live_daemon_with_the_openai_client(smollm2: Path, tmp_path: Path):
    """The daemon serving SmolLM2 over HTTP, driven by the official client: a named tool choice over seeds
    (arguments valid under the schema), streamed, and response_format json_schema; auto refused."""
    import openai

    from daemon_util import DaemonProcess

    daemon = DaemonProcess(tmp_path, smollm2, http_listen="127.0.0.1:0")
    try:
        client = openai.OpenAI(base_url=daemon.http_url + "/v1", api_key="unused", max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        for seed in range(4):
            r = client.chat.completions.create(model=model, messages=WEATHER_USER, tools=TOOLS, tool_choice=NAMED,
                                               temperature=1.0, seed=seed, max_tokens=200)
            choice = r.choices[0]
            assert choice.finish_reason == "tool_calls" and choice.message.content is None
            (call,) = choice.message.tool_calls
            assert call.id.startswith("call_") and call.type == "function"
            assert call.function.name == "get_weather"
            jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)
        stream = client.chat.completions.create(model=model, messages=WEATHER_USER, tools=TOOLS, stream=True,
                                                tool_choice="required", parallel_tool_calls=False, seed=7,
                                                max_tokens=200)
        chunks = [c.model_dump() for c in stream]
        content, calls, finish = assemble(chunks)
        assert finish == "tool_calls" and len(calls) == 1 and calls[0]["id"].startswith("call_")
        jsonschema.validate(json.loads(calls[0]["arguments"]), SCHEMAS[calls[0]["name"]])
        schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                  "required": ["city"], "additionalProperties": False}
        for seed in range(3):
            r = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Name a city, as JSON."}], seed=seed,
                response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
                max_tokens=60)
            jsonschema.validate(json.loads(r.choices[0].message.content), schema)
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=WEATHER_USER, tools=TOOLS, tool_choice="auto")
        assert e.value.body["param"] == "tool_choice"
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=WEATHER_USER, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})
        assert e.value.body["param"] == "response_format.json_schema.schema"
    finally:
        daemon.stop()
