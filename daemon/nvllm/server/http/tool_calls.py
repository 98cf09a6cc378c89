"""OpenAI tool calls on /v1/chat/completions: checking tools and tool_choice, the constraint each choice
means, and reading the calls back out of the model's text, whole or streamed.

Two ways a model writes calls:
- "tagged": the format of a family nvllm knows, read from the model's chat template text. Qwen2.5, Qwen3
  (and Hermes-style templates) write `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
  possibly after some text and possibly several. tool_choice "auto" needs this: the model may answer in
  text, and once it opens a call its body is constrained to one of the tools (a lazy Lark grammar).
- "json": any other model. Its template does not take tools, so the engine describes them in the system
  message (chat_template.describe_tools) and asks for `{"name": ..., "arguments": {...}}` (or a list of
  them); "required" and a named function constrain the whole answer to exactly that. "auto" cannot be
  offered (nothing tells text from a call), so it is refused with 400 naming tool_choice.

Each call comes back as OpenAI's {"id": "call_...", "type": "function", "function": {"name", "arguments"}}
where arguments is the JSON text the model wrote; streamed, a call's first delta carries index, id, type
and name, the following ones pieces of its arguments.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Optional

from nvllm.sampling_params import StructuredSpec
from nvllm.server.http.errors import bad_request

MAX_TOOLS = 128               # OpenAI's limit on tools per request
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")   # OpenAI's rule for function names
# A function without parameters takes none: its arguments are an empty object.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}

TAG_OPEN, TAG_CLOSE = "<tool_call>", "</tool_call>"


# ------------------------------------------------------------------------------------------ request side


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict[str, Any]


@dataclass
class ToolPlan:
    """What a request's tools mean for its prompt, its constraint and the reading of its answer."""
    tools: list[dict[str, Any]]            # OpenAI's tools, checked, for the prompt ({"messages", "tools"})
    choice: str                            # "none", "auto", "required" or "named"
    style: Optional[str]                   # "tagged" or "json": how calls are read back; None for "none"
    constraint: Optional[StructuredSpec]   # what the engine constrains the answer to
    parallel: bool
    named: Optional[str] = None


def tool_format(chat_template: Optional[str]) -> Optional[str]:
    """The tool-call format a model writes, known from its chat template text: "tagged" or None."""
    if chat_template and TAG_OPEN in chat_template and TAG_CLOSE in chat_template:
        return "tagged"
    return None


def parse_tools(tools: Any) -> list[Tool]:
    """Check OpenAI's tools; 400 naming the field for anything malformed."""
    if not isinstance(tools, list):
        raise bad_request("tools", f"tools must be a list of tools, got {type(tools).__name__}")
    if len(tools) > MAX_TOOLS:
        raise bad_request("tools", f"tools may hold at most {MAX_TOOLS} tools, got {len(tools)}")
    out: list[Tool] = []
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad_request(at, f"{at} must be an object like {{\"type\": \"function\", \"function\": {{...}}}}")
        if tool.get("type") != "function":
            raise bad_request(f"{at}.type", f"{at}.type must be 'function', got {tool.get('type')!r}")
        unknown = sorted(set(tool) - {"type", "function"})
        if unknown:
            raise bad_request(f"{at}.{unknown[0]}", f"{at}.{unknown[0]} is not supported")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise bad_request(f"{at}.function", f"{at}.function must be an object with a name")
        unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise bad_request(f"{at}.function.{unknown[0]}", f"{at}.function.{unknown[0]} is not supported")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise bad_request(f"{at}.function.name", f"{at}.function.name must be 1 to 64 letters, digits, "
                                                     f"'_' or '-', got {_show(name)}")
        if any(t.name == name for t in out):
            raise bad_request(f"{at}.function.name", f"{at}.function.name {name!r} is used by an earlier tool")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise bad_request(f"{at}.function.description", f"{at}.function.description must be a string")
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise bad_request(f"{at}.function.strict", f"{at}.function.strict must be true or false")
        params = fn.get("parameters")
        if params is None:
            params = NO_PARAMETERS
        elif not isinstance(params, dict):
            raise bad_request(f"{at}.function.parameters",
                              f"{at}.function.parameters must be a JSON Schema object, got {_show(params)}")
        out.append(Tool(name, params))
    return out


def plan_tools(tools: Any, tool_choice: Any, parallel_tool_calls: Any,
               chat_template: Optional[str]) -> Optional[ToolPlan]:
    """The plan for a chat request's tools (None when it has none); ApiError 400 naming the field."""
    if parallel_tool_calls is None:
        parallel_tool_calls = True          # OpenAI's default
    elif not isinstance(parallel_tool_calls, bool):
        raise bad_request("parallel_tool_calls", "parallel_tool_calls must be true or false")
    if tools is None or tools == []:
        if tool_choice not in (None, "none"):
            raise bad_request("tool_choice", "tool_choice needs tools: the request has none")
        return None
    checked = parse_tools(tools)
    choice, named = _parse_choice(tool_choice, checked)
    style = tool_format(chat_template)
    if choice == "auto" and style is None:
        raise bad_request("tool_choice", "tool_choice 'auto' needs a model whose tool-call format nvllm knows "
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
    constraint = (_tagged_constraint(use, parallel, forced=choice != "auto") if style == "tagged"
                  else _json_constraint(use, parallel))
    return ToolPlan(prompt_tools, choice, style, constraint, parallel, named)


def _parse_choice(tool_choice: Any, tools: list[Tool]) -> tuple[str, Optional[str]]:
    if tool_choice is None:
        return "auto", None
    if isinstance(tool_choice, str):
        if tool_choice in ("none", "auto", "required"):
            return tool_choice, None
        raise bad_request("tool_choice", f"tool_choice must be 'none', 'auto', 'required' or "
                                         f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, "
                                         f"got {_show(tool_choice)}")
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" or \
            not isinstance(tool_choice.get("function"), dict):
        raise bad_request("tool_choice", "tool_choice must be 'none', 'auto', 'required' or "
                                         "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    name = tool_choice["function"].get("name")
    if not any(t.name == name for t in tools):
        raise bad_request("tool_choice.function.name",
                          f"tool_choice.function.name {_show(name)} names no tool of the request "
                          f"(tools: {', '.join(t.name for t in tools)})")
    return "named", name


def _call_schema(tool: Tool) -> dict[str, Any]:
    """One call as a JSON object: the name first, then the arguments under the tool's parameter schema."""
    return {"type": "object",
            "properties": {"name": {"const": tool.name}, "arguments": closed(tool.parameters)},
            "required": ["name", "arguments"], "additionalProperties": False}


def closed(schema: Any) -> Any:
    """The schema with objects that list their properties closed to others (additionalProperties false
    where it says nothing). Arguments valid under it are valid under the original; without it a small
    model invents property after property until max_tokens. Objects without listed properties, and
    anything under allOf (whose parts may rely on each other's properties), are left open."""
    if not isinstance(schema, dict) or "allOf" in schema:
        return schema
    out = dict(schema)
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: closed(v) for k, v in out["properties"].items()}
        if not any(k in out for k in ("additionalProperties", "patternProperties", "unevaluatedProperties")):
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key])
    for key in ("anyOf", "oneOf", "prefixItems"):
        if isinstance(out.get(key), list):
            out[key] = [closed(v) for v in out[key]]
    for key in ("$defs", "definitions"):
        if isinstance(out.get(key), dict):
            out[key] = {k: closed(v) for k, v in out[key].items()}
    return out


def _any_call_schema(tools: list[Tool]) -> dict[str, Any]:
    return _call_schema(tools[0]) if len(tools) == 1 else {"anyOf": [_call_schema(t) for t in tools]}


def _json_constraint(tools: list[Tool], parallel: bool) -> StructuredSpec:
    """The whole answer is a call ({"name", "arguments"}), or with parallel calls a non-empty list of them."""
    one = _any_call_schema(tools)
    schema = {"type": "array", "items": one, "minItems": 1} if parallel else one
    return StructuredSpec("json_schema", json.dumps(schema, ensure_ascii=False))


def _tagged_constraint(tools: list[Tool], parallel: bool, forced: bool) -> StructuredSpec:
    """A Lark grammar for <tool_call> calls. Forced: the answer is one call (or several, one per line).
    Auto: free text, where `<tool_call>` (a lazy trigger) starts a call whose body is constrained; after
    a call come more text and calls, or with parallel calls off only whitespace."""
    # The call's JSON as these models write it (", " and ": "), no other whitespace: a free-whitespace JSON
    # lets a weak model pad forever.
    schema = {"x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
              **_any_call_schema(tools)}
    body = json.dumps(schema, ensure_ascii=False)
    close = json.dumps("\n" + TAG_CLOSE)
    if forced:
        start = 'start: call ("\\n" call)*' if parallel else "start: call"
        call = f'call: {json.dumps(TAG_OPEN + chr(10))} %json {body} {close}'
        lines = ["%llguidance {}", start, call]
    else:
        start = "start: call* TEXT" if parallel else "start: TEXT | call WS"
        lines = ["%llguidance {}", start, "TEXT: /(.|\\n)*/", "WS: /\\s*/",
                 f"call_open[lazy]: TEXT {json.dumps(TAG_OPEN)}",
                 f'call: call_open "\\n" %json {body} {close}']
    return StructuredSpec("grammar", "\n".join(lines) + "\n")


def _show(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return text if len(text) <= 48 else text[:48] + "..."


# ------------------------------------------------------------------------------------------ answer side


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass
class ToolCall:
    name: str
    arguments: str          # the JSON text of the arguments, as the model wrote it
    id: str = field(default_factory=new_call_id)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def read_tool_calls(text: str, plan: ToolPlan) -> tuple[Optional[str], list[ToolCall]]:
    """(content, calls) of a finished answer. Text that is no complete call stays content (an answer cut
    short by max_tokens comes back as text, with no half call)."""
    if plan.style == "json":
        calls = _json_calls(text)
        return (None, calls) if calls else (text or None, [])
    if plan.style != "tagged":
        return text, []
    content, calls, pos = [], [], 0
    while True:
        start = text.find(TAG_OPEN, pos)
        if start < 0:
            break
        end = text.find(TAG_CLOSE, start)
        call = None if end < 0 else _tagged_call(text[start + len(TAG_OPEN):end])
        if call is None:
            break
        content.append(text[pos:start].rstrip())   # the blank before a call is no content
        calls.append(call)
        pos = end + len(TAG_CLOSE)
    content.append(text[pos:].rstrip() if calls else text[pos:])
    return "".join(content) or None, calls


def _json_calls(text: str) -> list[ToolCall]:
    try:
        value = json.loads(text)
    except ValueError:
        return []
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        call = _call_from_text(json.dumps(item, ensure_ascii=False)) if isinstance(item, dict) else None
        if call is None:
            return []
        calls.append(call)
    # Keep the model's own argument text, so a streamed answer and a whole one agree.
    scanned = _scan_calls(text)
    if len(scanned) == len(calls) and all(s.done for s in scanned):
        for call, s in zip(calls, scanned):
            call.arguments = s.arguments
    return calls


def _tagged_call(body: str) -> Optional[ToolCall]:
    return _call_from_text(body.strip())


def _call_from_text(text: str) -> Optional[ToolCall]:
    """A call from the JSON text of {"name": ..., "arguments": {...}}; None if it is not one."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    scanned = _scan_calls(text)
    if len(scanned) == 1 and scanned[0].done and scanned[0].args_key:
        return ToolCall(obj["name"], scanned[0].arguments)
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        return ToolCall(obj["name"], args)
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


# ---- scanning partial JSON: enough to stream a call's name and the raw text of its arguments


@dataclass
class _Partial:
    name: Optional[str] = None   # once its string is complete
    arguments: str = ""          # the raw arguments text so far
    args_key: bool = False       # the arguments key has been seen
    done: bool = False           # the object is closed


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _string_end(text: str, i: int) -> Optional[int]:
    """Index just past the JSON string starting at text[i] == '"'; None if it is not closed yet."""
    i += 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        i += 1
    return None


def _value_end(text: str, i: int) -> Optional[int]:
    """Index just past the JSON value starting at text[i]; None if it is not complete yet."""
    if i >= len(text):
        return None
    c = text[i]
    if c == '"':
        return _string_end(text, i)
    if c in "{[":
        depth = 0
        while i < len(text):
            c = text[i]
            if c == '"':
                end = _string_end(text, i)
                if end is None:
                    return None
                i = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return None
    j = i
    while j < len(text) and text[j] not in ",}] \t\r\n":
        j += 1
    return j if j < len(text) else None   # a number may still grow


def _scan_object(text: str, i: int) -> tuple[_Partial, Optional[int]]:
    """The call object starting at text[i] == '{', read as far as it goes: (what is known, end or None)."""
    part = _Partial()
    i += 1
    while True:
        i = _skip_ws(text, i)
        if i >= len(text):
            return part, None
        if text[i] == "}":
            part.done = True
            return part, i + 1
        if text[i] == ",":
            i += 1
            continue
        if text[i] != '"':
            return part, None
        key_end = _string_end(text, i)
        if key_end is None:
            return part, None
        key = json.loads(text[i:key_end])
        i = _skip_ws(text, key_end)
        if i >= len(text) or text[i] != ":":
            return part, None
        i = _skip_ws(text, i + 1)
        if i >= len(text):
            if key in ("arguments", "parameters"):
                part.args_key = True
            return part, None
        end = _value_end(text, i)
        if key == "name" and end is not None and text[i] == '"':
            part.name = json.loads(text[i:end])
        elif key in ("arguments", "parameters"):
            part.args_key = True
            part.arguments = text[i:] if end is None else text[i:end]
        if end is None:
            return part, None
        i = end


def _scan_calls(text: str) -> list[_Partial]:
    """The calls of a "json"-style answer so far: one object, or a list of objects."""
    i = _skip_ws(text, 0)
    if i >= len(text):
        return []
    if text[i] == "{":
        return [_scan_object(text, i)[0]]
    if text[i] != "[":
        return []
    out = []
    i += 1
    while True:
        i = _skip_ws(text, i)
        if i < len(text) and text[i] == ",":
            i += 1
            continue
        if i >= len(text) or text[i] != "{":
            return out
        part, end = _scan_object(text, i)
        out.append(part)
        if end is None:
            return out
        i = end


class ToolCallStream:
    """Turns a streamed answer's text deltas into OpenAI chat deltas: {"content": ...} for text and
    {"tool_calls": [{"index", "id", "type", "function": {"name", "arguments"}}]} for calls. The pieces add
    up to what read_tool_calls gives for the whole text (content and each call's arguments)."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self._sent = 0                             # characters of text sent or passed over as content
        self._calls: list[tuple[str, int]] = []   # (id, argument characters sent) per started call

    @property
    def num_calls(self) -> int:
        return len(self._calls)

    def feed(self, delta: str, final: bool = False) -> list[dict[str, Any]]:
        """The deltas for new text; final=True with the last piece flushes held-back content."""
        self.text += delta
        if self.plan.style == "json":
            out = self._call_deltas(_scan_calls(self.text))
            if final and not self._calls and self.text:
                out.append({"content": self.text})   # no call at all (cut short): the text, as read_tool_calls
            return out
        if self.plan.style != "tagged":
            return [{"content": delta}] if delta else []
        return self._tagged(final)

    def _tagged(self, final: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        text, parts, pos = self.text, [], 0
        while True:
            start = text.find(TAG_OPEN, pos)
            if start < 0:
                break
            self._send(out, pos, pos + len(text[pos:start].rstrip()))
            self._sent = max(self._sent, start)
            body_start = start + len(TAG_OPEN)
            end = text.find(TAG_CLOSE, body_start)
            body = text[body_start:] if end < 0 else text[body_start:end]
            first = _skip_ws(body, 0)
            part = _scan_object(body, first)[0] if first < len(body) and body[first] == "{" else _Partial()
            parts.append(part)
            if end < 0:
                return out + self._call_deltas(parts)
            if not part.done or part.name is None:
                break        # not a call after all: read_tool_calls leaves it as text too
            pos = end + len(TAG_CLOSE)
        out += self._call_deltas([p for p in parts if p.done and p.name is not None])
        hi = len(text)
        if not final:
            # Hold back what could be the start of a <tool_call>, and trailing blanks (dropped before a call).
            for k in range(min(len(TAG_OPEN) - 1, hi - pos), 0, -1):
                if TAG_OPEN.startswith(text[hi - k:]):
                    hi -= k
                    break
            hi = pos + len(text[pos:hi].rstrip())
        elif self._calls:
            hi = pos + len(text[pos:].rstrip())
        self._send(out, pos, hi)
        return out

    def _send(self, out: list[dict[str, Any]], lo: int, hi: int) -> None:
        lo = max(lo, self._sent)
        if hi > lo:
            out.append({"content": self.text[lo:hi]})
            self._sent = hi

    def _call_deltas(self, parts: list[_Partial]) -> list[dict[str, Any]]:
        out = []
        for index, part in enumerate(parts):
            if part.name is None:
                break        # calls are sent in order, each once its name is known
            if index == len(self._calls):
                call_id = new_call_id()
                self._calls.append((call_id, 0))
                out.append({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                            "function": {"name": part.name, "arguments": ""}}]})
            call_id, sent = self._calls[index]
            if len(part.arguments) > sent:
                out.append({"tool_calls": [{"index": index,
                                            "function": {"arguments": part.arguments[sent:]}}]})
                self._calls[index] = (call_id, len(part.arguments))
        return out


def finish_reason(reason: Optional[str], num_calls: int) -> Optional[str]:
    """OpenAI's finish_reason: "tool_calls" when the answer ended with calls, else the engine's."""
    return "tool_calls" if num_calls and reason == "stop" else reason
