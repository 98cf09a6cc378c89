"""OpenAI tools on /v1/chat/completions, request side: checking tools, tool_choice and
parallel_tool_calls, and the plan they make (the prompt's tools, the constraint, how calls read back).

Two ways a model writes calls:
- "tagged": the format of a family nvllm knows, read from the model's chat template text. Qwen2.5, Qwen3
  (and Hermes-style templates) write `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
  possibly after some text and possibly several. tool_choice "auto" needs this: the model may answer in
  text, and once it opens a call its body is constrained to one of the tools (a lazy Lark grammar).
- "json": any other model. Its template does not take tools, so the engine describes them in the system
  message (chat_template.describe_tools) and asks for `{"name": ..., "arguments": {...}}` (or a list of
  them); "required" and a named function constrain the whole answer to exactly that. "auto" cannot be
  offered (nothing tells text from a call), so it is refused with 400 naming tool_choice.

The constraints themselves are built in tool_grammar.py; the answer is read back in tool_calls.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from nvllm.sampling_params import StructuredSpec
from nvllm.server.chat.field_error import bad_field, show
from nvllm.server.chat.tool_grammar import TAG_CLOSE, TAG_OPEN, Tool, json_constraint, tagged_constraint

MAX_TOOLS = 128               # OpenAI's limit on tools per request
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")   # OpenAI's rule for function names
# A function without parameters takes none: its arguments are an empty object.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass
class ToolPlan:
    """What a request's tools mean for its prompt, its constraint and the reading of its answer."""
    tools: list[dict[str, Any]]            # OpenAI's tools, checked, for the prompt ({"messages", "tools"})
    choice: str                            # "none", "auto", "required" or "named"
    style: str | None                      # "tagged" or "json": how calls are read back; None for "none"
    constraint: StructuredSpec | None      # what the engine constrains the answer to
    parallel: bool
    named: str | None = None


def tool_format(chat_template: str | None) -> str | None:
    """The tool-call format a model writes, known from its chat template text: "tagged" or None."""
    if chat_template and TAG_OPEN in chat_template and TAG_CLOSE in chat_template:
        return "tagged"
    return None


def parse_tools(tools: Any) -> list[Tool]:
    """Check OpenAI's tools; 400 naming the field for anything malformed."""
    if not isinstance(tools, list):
        raise bad_field("tools", f"tools must be a list of tools, got {type(tools).__name__}")
    if len(tools) > MAX_TOOLS:
        raise bad_field("tools", f"tools may hold at most {MAX_TOOLS} tools, got {len(tools)}")
    out: list[Tool] = []
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad_field(at, f"{at} must be an object like {{\"type\": \"function\", \"function\": {{...}}}}")
        if tool.get("type") != "function":
            raise bad_field(f"{at}.type", f"{at}.type must be 'function', got {tool.get('type')!r}")
        unknown = sorted(set(tool) - {"type", "function"})
        if unknown:
            raise bad_field(f"{at}.{unknown[0]}", f"{at}.{unknown[0]} is not supported")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise bad_field(f"{at}.function", f"{at}.function must be an object with a name")
        unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise bad_field(f"{at}.function.{unknown[0]}", f"{at}.function.{unknown[0]} is not supported")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise bad_field(f"{at}.function.name", f"{at}.function.name must be 1 to 64 letters, digits, "
                                                     f"'_' or '-', got {show(name)}")
        if any(t.name == name for t in out):
            raise bad_field(f"{at}.function.name", f"{at}.function.name {name!r} is used by an earlier tool")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise bad_field(f"{at}.function.description", f"{at}.function.description must be a string")
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise bad_field(f"{at}.function.strict", f"{at}.function.strict must be true or false")
        params = fn.get("parameters")
        if params is None:
            params = NO_PARAMETERS
        elif not isinstance(params, dict):
            raise bad_field(f"{at}.function.parameters",
                              f"{at}.function.parameters must be a JSON Schema object, got {show(params)}")
        out.append(Tool(name, params))
    return out


def plan_tools(tools: Any, tool_choice: Any, parallel_tool_calls: Any,
               chat_template: str | None) -> ToolPlan | None:
    """The plan for a chat request's tools (None when it has none); ApiError 400 naming the field."""
    if parallel_tool_calls is None:
        parallel_tool_calls = True          # OpenAI's default
    elif not isinstance(parallel_tool_calls, bool):
        raise bad_field("parallel_tool_calls", "parallel_tool_calls must be true or false")
    if tools is None or tools == []:
        if tool_choice not in (None, "none"):
            raise bad_field("tool_choice", "tool_choice needs tools: the request has none")
        return None
    checked = parse_tools(tools)
    choice, named = _parse_choice(tool_choice, checked)
    style = tool_format(chat_template)
    if choice == "auto" and style is None:
        raise bad_field("tool_choice", "tool_choice 'auto' needs a model whose tool-call format nvllm knows "
                                         "(Qwen2.5/Qwen3's <tool_call>); this model's chat template has none: "
                                         "use 'required', a named function, or 'none'")
    prompt_tools = [{"type": "function", "function": t["function"]} for t in tools]
    if choice == "none":
        return ToolPlan(prompt_tools, choice, None, None, parallel_tool_calls)
    style = style or "json"
    if choice == "named":
        use = [t for t in checked if t.name == named]
        parallel = False
    else:
        use, parallel = checked, parallel_tool_calls
    constraint = (tagged_constraint(use, parallel, forced=choice != "auto") if style == "tagged"
                  else json_constraint(use, parallel))
    return ToolPlan(prompt_tools, choice, style, constraint, parallel, named)


def _parse_choice(tool_choice: Any, tools: list[Tool]) -> tuple[str, str | None]:
    if tool_choice is None:
        return "auto", None
    if isinstance(tool_choice, str):
        if tool_choice in ("none", "auto", "required"):
            return tool_choice, None
        raise bad_field("tool_choice", f"tool_choice must be 'none', 'auto', 'required' or "
                                         f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, "
                                         f"got {show(tool_choice)}")
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" or \
            not isinstance(tool_choice.get("function"), dict):
        raise bad_field("tool_choice", "tool_choice must be 'none', 'auto', 'required' or "
                                         "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    name = tool_choice["function"].get("name")
    if not any(t.name == name for t in tools):
        raise bad_field("tool_choice.function.name",
                          f"tool_choice.function.name {show(name)} names no tool of the request "
                          f"(tools: {', '.join(t.name for t in tools)})")
    return "named", name

