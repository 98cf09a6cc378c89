"""The constraints that hold a model's tool calls to the request's tools: a JSON Schema for the "json"
style, a Lark grammar for the "tagged" style (tool_plan.py says which a request gets)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from nvllm.sampling_params import StructuredSpec

TAG_OPEN, TAG_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class Tool:
    """A checked function tool: its name and the JSON Schema of its arguments."""
    name: str
    parameters: dict[str, Any]


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


def json_constraint(tools: list[Tool], parallel: bool) -> StructuredSpec:
    """The whole answer is a call ({"name", "arguments"}), or with parallel calls a non-empty list of them."""
    one = _any_call_schema(tools)
    schema = {"type": "array", "items": one, "minItems": 1} if parallel else one
    return StructuredSpec("json_schema", json.dumps(schema, ensure_ascii=False))


def tagged_constraint(tools: list[Tool], parallel: bool, forced: bool) -> StructuredSpec:
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
        # tags and JSON alone: the calls' numbers get the digit budget a json_schema answer has
        return StructuredSpec("grammar", "\n".join(["%llguidance {}", start, call]) + "\n", digits_schema=body)
    # Free text around the calls: a budget over the whole answer would hold the text's digits too.
    start = "start: call* TEXT" if parallel else "start: TEXT | call WS"
    lines = ["%llguidance {}", start, "TEXT: /(.|\\n)*/", "WS: /\\s*/",
             f"call_open[lazy]: TEXT {json.dumps(TAG_OPEN)}",
             f'call: call_open "\\n" %json {body} {close}']
    return StructuredSpec("grammar", "\n".join(lines) + "\n")
