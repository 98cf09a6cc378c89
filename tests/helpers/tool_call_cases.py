"""What the tool-call tests share (tests/server/chat/test_tool_*.py, test_response_format.py): the tools and their
schemas, a Qwen2.5-style chat template that takes tools, the tiny-qwen3 folder that carries it, and the small
checks the unit tests repeat (a plan that must exist, its constraint's text, a 400 naming the field)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from nvllm.server.chat.field_error import FieldError
from nvllm.server.chat.tool_plan import ToolPlan, plan_tools

if TYPE_CHECKING:
    # The official client's request types: the data below is what the live-daemon test hands to openai.
    from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionNamedToolChoiceParam

WEATHER_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMS: dict[str, Any] = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
                               "required": ["zone"], "additionalProperties": False}
TOOLS: list[ChatCompletionFunctionToolParam] = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a zone",
                                      "parameters": TIME_PARAMS}},
]
DAY_PARAMS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
SCHEMAS: dict[str, dict[str, Any]] = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS, "get_day": DAY_PARAMS}
# Short tools for the tiny Qwen model, whose 512-token context and small vocabulary leave little room.
SHORT_TOOLS: list[ChatCompletionFunctionToolParam] = [
    {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMS}},
    {"type": "function", "function": {"name": "get_day"}}]
NAMED: ChatCompletionNamedToolChoiceParam = {"type": "function", "function": {"name": "get_weather"}}

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


def make_qwen_tools(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-qwen3 with the Qwen-style tool template above (the body of each test file's qwen_tools fixture)."""
    folder = tmp_path_factory.mktemp("qwen-tools") / "tiny-qwen3-tools"
    shutil.copytree(tiny_models["tiny-qwen3"], folder)
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = QWEN_TOOLS_TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    return folder


def smollm2_template(smollm2: Path) -> str:
    return json.loads((smollm2 / "tokenizer_config.json").read_text())["chat_template"]


def refused(call: Callable[[], object], param: str) -> FieldError:
    with pytest.raises(FieldError) as e:
        call()
    assert e.value.field == param, (e.value.field, e.value.message)
    return e.value


def tool_plan(tools: Any, tool_choice: Any, parallel_tool_calls: Any, chat_template: str | None) -> ToolPlan:
    """plan_tools for a request that has tools, which always gets a plan (None is for a request without)."""
    plan = plan_tools(tools, tool_choice, parallel_tool_calls, chat_template)
    assert plan is not None, "a request with tools gets a plan"
    return plan


def constraint_text(plan: ToolPlan) -> str:
    """The text of a plan's constraint: the JSON schema of the json style, the Lark grammar of the tagged one."""
    assert plan.constraint is not None, plan
    assert isinstance(plan.constraint.value, str), plan.constraint
    return plan.constraint.value
