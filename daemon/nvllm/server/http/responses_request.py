"""OpenAI's Responses API, request side: a POST /v1/responses body read into the chat request every front
door shares (server/chat/chat_request.py), and the settings its response repeats (responses_response.py
shapes the answer).

Stateless, as vLLM and llama-server serve it: nothing is kept between requests, so `store: true` and
`previous_response_id` are refused (the client sends the whole conversation as input items every time);
an absent `store`, which OpenAI's API reads as true, is read as false here. Input items become OpenAI
chat's messages: `instructions` a system message first, developer messages system ones, consecutive
function_call items the tool_calls of one assistant message (with the assistant text just before them),
each function_call_output a tool message, reasoning items dropped. Every other field is mapped or refused
with 400 naming it in the Responses API's spelling (`tools[0].name`, `text.format.schema`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from nvllm.engine.prompt import Prompt
from nvllm.sampling_params import InvalidParameter, SamplingParams, StructuredSpec
from nvllm.server.chat.chat_request import ChatRequest
from nvllm.server.chat.field_error import FieldError, show
from nvllm.server.chat.response_format import Constraint, json_schema_constraint
from nvllm.server.chat.tool_plan import ToolPlan
from nvllm.server.http.body import ARRAY, BOOL, INT, OBJECT, REAL, STRING, check_model, need
from nvllm.server.http.errors import ApiError, bad_request
from nvllm.server.reading import Served

FIELDS = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
          "max_output_tokens", "temperature", "top_p", "reasoning", "stream", "user", "metadata", "truncation",
          "store", "previous_response_id", "include", "background", "service_tier", "priority",
          "truncate_prompt_tokens"}     # the last two nvllm's (vLLM's)
ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
SUMMARIES = ("auto", "concise", "detailed")
STATELESS = "this server keeps no state"
# The engine's names of the fields it refuses -> this API's.
ENGINE_FIELDS = {"max_tokens": "max_output_tokens", "messages": "input", "prompt": "input",
                 "prompt_token_ids": "input", "context_overflow": "truncation",
                 "chat_template_kwargs": "reasoning.effort"}


@dataclass
class ResponsesRequest:
    """A Responses body read and checked: one engine request, and what the response object repeats."""
    prompt: Prompt
    params: SamplingParams
    tool_plan: ToolPlan | None = None
    constraint_param: str | None = None    # the field the engine's constraint came from, for its refusals
    template_kwargs: dict[str, Any] | None = None
    echo: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    priority: int = 0
    user: str | None = None

    def choices(self) -> list[tuple[Prompt, SamplingParams]]:
        return [(self.prompt, self.params)]

    def refusal(self, e: InvalidParameter) -> ApiError:
        """An engine-side refusal as 400 naming this API's field."""
        name = ENGINE_FIELDS.get(e.field, e.field)
        if e.field.startswith("structured") and self.constraint_param:
            name = self.constraint_param
            if name == "tools":   # the constraint was built from the tools: the reason is what helps
                return bad_request(name, f"tools: a function's parameters schema cannot be used: {e.reason}")
        text = str(e)
        if name != e.field and text.startswith(e.field):
            text = name + text[len(e.field):]
        text = text.replace("context_overflow 'drop_oldest'", "truncation 'auto'")
        if name == "max_output_tokens":
            text = text.replace("+ max_tokens", "+ max_output_tokens")
        return bad_request(name, text)


def read_responses(body: dict[str, Any], state: Served) -> ResponsesRequest:
    # the template tells the model's tool-call format (tool_plan.py)
    return parse_responses(body, state.model_name, state.engine.chat_template)


def parse_responses(body: dict[str, Any], model_name: str, chat_template: str | None = None) -> ResponsesRequest:
    """chat_template: the model's template text, which tells its tool-call format."""
    for key in body:
        if key not in FIELDS:
            raise bad_request(key[:80], f"unknown parameter {key[:64]!r}", code="unknown_parameter")
    check_model(body, model_name)
    _stateless(body)
    params = SamplingParams()
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            setattr(params, name, need(name, body[name], REAL))
    if body.get("max_output_tokens") is not None:
        params.max_tokens = need("max_output_tokens", body["max_output_tokens"], INT)
    if body.get("truncate_prompt_tokens") is not None:
        params.truncate_prompt_tokens = need("truncate_prompt_tokens", body["truncate_prompt_tokens"], INT)
    truncation = body.get("truncation")
    if truncation not in (None, "disabled", "auto"):
        raise bad_request("truncation", f"truncation must be 'disabled' or 'auto', got {show(truncation, repr)}")
    if truncation is not None:   # "auto" drops the conversation's oldest turns to fit; unset: the server's default
        params.context_overflow = "drop_oldest" if truncation == "auto" else "error"
    effort, summary = _reasoning(body.get("reasoning"))
    # Qwen3's switch: effort "none" writes the empty think block (templates without it ignore the variable).
    kwargs = {"enable_thinking": False} if effort == "none" else None
    constraint, text_format = _text(body.get("text"))
    tools = _tools(body.get("tools"))
    chat = ChatRequest(input_messages(body.get("input"), body.get("instructions")), params, tools,
                       _tool_choice(body.get("tool_choice")), body.get("parallel_tool_calls"), constraint, kwargs)
    try:
        planned = chat.plan(chat_template)
    except FieldError as e:
        raise bad_request(_rename(e.field) if e.field else None, _rename(e.message), e.code) from None
    req = ResponsesRequest(planned.prompt, planned.params, planned.tool_plan, planned.constraint_param, kwargs)
    if body.get("stream") is not None:
        req.stream = need("stream", body["stream"], BOOL)
    if body.get("user") is not None:
        req.user = need("user", body["user"], STRING)[:256]
    if body.get("priority") is not None:
        req.priority = need("priority", body["priority"], INT)
    req.echo = {
        "instructions": body.get("instructions"), "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,     # OpenAI's default: true
        "temperature": params.temperature, "top_p": params.top_p, "max_output_tokens": params.max_tokens,
        "text": {"format": text_format}, "truncation": truncation or "disabled",
        "reasoning": {"effort": effort, "summary": summary}, "metadata": _metadata(body.get("metadata")),
        "user": req.user, "store": False, "previous_response_id": None, "background": False,
    }
    return req


def _stateless(body: dict[str, Any]) -> None:
    """What needs a stored response: refused, saying what to send instead."""
    if body.get("store") is not None and need("store", body["store"], BOOL):
        raise bad_request("store", f"store must be false: {STATELESS} (no response is stored); send store: false "
                                   "and the whole conversation as input items", code="unsupported_parameter")
    if body.get("previous_response_id") is not None:
        raise bad_request("previous_response_id", f"previous_response_id cannot be used: {STATELESS}, so it has no "
                                                  "earlier responses; send the whole conversation as input items "
                                                  "(store: false)", code="unsupported_parameter")
    include = body.get("include")
    if include is not None and need("include", include, ARRAY):
        raise bad_request("include", "include must be empty: nvllm adds no extra output data "
                                     f"(asked for {show(include[0], repr)})", code="unsupported_parameter")
    if body.get("background") is not None and need("background", body["background"], BOOL):
        raise bad_request("background", f"background must be false: {STATELESS}, so a response cannot be "
                                        "fetched later", code="unsupported_parameter")
    if body.get("service_tier") not in (None, "auto", "default"):
        raise bad_request("service_tier", "service_tier must be 'auto' or 'default' (nvllm has one tier)",
                          code="unsupported_parameter")


def input_messages(items: Any, instructions: Any) -> list[dict[str, Any]]:
    """A Responses input (a string, or a list of items) as OpenAI chat's messages."""
    out: list[dict[str, Any]] = []
    if instructions is not None:
        out.append({"role": "system", "content": need("instructions", instructions, STRING)})
    if isinstance(items, str):
        return out + [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_request("input", "input must be a string or a non-empty array of input items")
    call_ids: set[str] = set()
    for i, item in enumerate(items):
        at = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(at, f"{at} must be an object (a message, function_call, function_call_output or "
                                  "reasoning item)")
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message(item, at))
        elif kind == "function_call":
            call = _function_call(item, at)
            call_ids.add(call["id"])
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":   # the same turn: its text, then its calls
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            _keys(item, at, {"type", "call_id", "output", "id", "status"})
            call_id = need(f"{at}.call_id", item.get("call_id"), STRING)
            if call_id not in call_ids:
                raise bad_request(f"{at}.call_id", f"{at}.call_id {show(call_id, repr)} answers no function_call "
                                                   f"item before it (send the call too: {STATELESS})")
            out.append({"role": "tool", "tool_call_id": call_id,
                        "content": _content(item.get("output"), f"{at}.output")})
        elif kind != "reasoning":    # the model's earlier thinking: not part of the next prompt
            raise bad_request(f"{at}.type", f"{at}.type must be 'message', 'function_call', "
                                            f"'function_call_output' or 'reasoning', got {show(kind, repr)}"
                                            + (f" ({STATELESS}: send the items themselves)"
                                               if kind == "item_reference" else ""))
    if not out:
        raise bad_request("input", "input holds no message")
    return out


def _message(item: dict[str, Any], at: str) -> dict[str, Any]:
    _keys(item, at, {"type", "role", "content", "id", "status"})
    role = item.get("role")
    if role not in ROLES:
        raise bad_request(f"{at}.role", f"{at}.role must be 'user', 'system', 'developer' or 'assistant', "
                                        f"got {show(role, repr)}")
    return {"role": ROLES[role], "content": _content(item.get("content"), f"{at}.content")}


def _content(content: Any, at: str) -> str | list[dict[str, Any]]:
    """A string, or text parts (input_text, output_text) as chat's text parts (joined by the engine)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(at, f"{at} must be a string or an array of text parts")
    parts = []
    for j, part in enumerate(content):
        where = f"{at}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text"):
            raise bad_request(f"{where}.type", f"{where}.type must be 'input_text' or 'output_text', got "
                                               f"{show(kind, repr)} (audio: chat completions' input_audio)")
        _keys(part, where, {"type", "text", "annotations", "logprobs"})
        parts.append({"type": "text", "text": need(f"{where}.text", part.get("text"), STRING)})
    return parts


def _function_call(item: dict[str, Any], at: str) -> dict[str, Any]:
    _keys(item, at, {"type", "call_id", "name", "arguments", "id", "status"})
    call_id = need(f"{at}.call_id", item.get("call_id"), STRING)
    name = need(f"{at}.name", item.get("name"), STRING)
    arguments = need(f"{at}.arguments", item.get("arguments"), STRING)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """Responses' function tools in chat's shape; the rest of their checks are tool_plan.py's."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(need("tools", tools, ARRAY)):
        at = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad_request(at, f"{at} must be an object like {{\"type\": \"function\", \"name\": ...}}")
        if tool.get("type") != "function":
            raise bad_request(f"{at}.type", f"{at}.type {show(tool.get('type'), repr)} is not supported: nvllm runs no "
                                            "tools itself, it offers the model function tools the client runs "
                                            "(type 'function')", code="unsupported_parameter")
        _keys(tool, at, {"type", "name", "description", "parameters", "strict"})
        out.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        _keys(choice, "tool_choice", {"type", "name"})
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise bad_request("tool_choice", "tool_choice must be 'none', 'auto', 'required' or "
                                     f"{{\"type\": \"function\", \"name\": ...}}, got {show(choice, repr)}")


def _text(text: Any) -> tuple[Constraint | None, dict[str, Any]]:
    """text.format as the engine's constraint, and the format the response repeats."""
    if text is None:
        return None, {"type": "text"}
    _keys(need("text", text, OBJECT), "text", {"format"})
    fmt = text.get("format")
    if fmt is None:
        return None, {"type": "text"}
    kind = need("text.format", fmt, OBJECT).get("type")
    if kind in ("text", "json_object"):
        _keys(fmt, "text.format", {"type"})
        return (None if kind == "text" else Constraint(StructuredSpec("json_object"), "text.format")), fmt
    if kind != "json_schema":
        raise bad_request("text.format.type", "text.format.type must be 'text', 'json_object' or 'json_schema', "
                                              f"got {show(kind, repr)}")
    try:
        return json_schema_constraint(fmt, "text.format", frozenset({"type"})), fmt
    except FieldError as e:
        raise bad_request(e.field, e.message, e.code) from None


def _reasoning(reasoning: Any) -> tuple[str | None, str | None]:
    """(effort, summary): accepted, and echoed; reasoning text comes back where the daemon has a parser."""
    if reasoning is None:
        return None, None
    _keys(need("reasoning", reasoning, OBJECT), "reasoning", {"effort", "summary", "generate_summary"})
    effort = reasoning.get("effort")
    if effort is not None and effort not in EFFORTS:
        raise bad_request("reasoning.effort", f"reasoning.effort must be one of {', '.join(EFFORTS)}, "
                                              f"got {show(effort, repr)}")
    summary = reasoning.get("summary", reasoning.get("generate_summary"))
    if summary is not None and summary not in SUMMARIES:
        raise bad_request("reasoning.summary", f"reasoning.summary must be one of {', '.join(SUMMARIES)}, "
                                               f"got {show(summary, repr)}")
    return effort, summary


def _metadata(metadata: Any) -> dict[str, str]:
    if metadata is None:
        return {}
    for key, value in need("metadata", metadata, OBJECT).items():
        if not isinstance(value, str):
            raise bad_request("metadata", f"metadata values must be strings ({key[:64]!r} is not)")
    return dict(metadata)


def _keys(obj: dict[str, Any], at: str, allowed: set[str]) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise bad_request(f"{at}.{extra[0]}"[:80], f"{at}.{extra[0][:64]} is not supported",
                          code="unknown_parameter")


_CHAT_PATHS = [(re.compile(r"\btools\[(\d+)\]\.function\."), r"tools[\1]."),
               (re.compile(r"\btools\[(\d+)\]\.function\b"), r"tools[\1]"),
               (re.compile(r"\btool_choice\.function\.name\b"), "tool_choice.name"),
               (re.compile(r"^text\b(?!\.)"), "text.format")]


def _rename(text: str) -> str:
    """A field path (or a message) in OpenAI chat's spelling, as the shared planner names it, in this API's."""
    for pattern, repl in _CHAT_PATHS:
        text = pattern.sub(repl, text)
    return text

