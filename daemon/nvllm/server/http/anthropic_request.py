"""Anthropic's Messages API -> nvllm: a /v1/messages body (or /v1/messages/count_tokens') read into the
shared ChatRequest (server/chat/chat_request.py), the conversation by anthropic_messages.py;
anthropic_response.py shapes the answer.

  tools [{name, description, input_schema}]       OpenAI's function tools
  tool_choice auto / any / tool {name} / none     "auto" / "required" / the named function / "none";
                                                  disable_parallel_tool_use: parallel_tool_calls false
  thinking enabled (or adaptive) / disabled       chat_template_kwargs enable_thinking true / false
  output_config.format {type: json_schema}        the answer constrained to the schema
  max_tokens (required), stop_sequences, temperature, top_p, top_k, and nvllm's context_overflow and
  truncate_prompt_tokens                          SamplingParams
  metadata.user_id                                the user in the log

Every other field is refused with 400 naming it, except the few that ask for nothing nvllm does not do at
the values they take (NEUTRAL). Refusals from the shared readers and the engine name OpenAI's spelling
(tools[0].function.name); `anthropic_name` gives the client its own (tools[0].name).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nvllm.engine.prompt import Prompt
from nvllm.sampling_params import InvalidParameter, SamplingParams
from nvllm.server.chat.chat_request import ChatRequest, context_overflow
from nvllm.server.chat.field_error import FieldError
from nvllm.server.chat.response_format import Constraint, json_schema_constraint
from nvllm.server.chat.tool_plan import ToolPlan
from nvllm.server.http.anthropic_messages import read_conversation
from nvllm.server.http.body import ARRAY, BOOL, INT, OBJECT, REAL, STRING, check_keys, check_model, need, only_keys
from nvllm.server.http.errors import ApiError, bad_request
from nvllm.server.reading import Served

SAMPLING_FIELDS = {"temperature": REAL, "top_p": REAL, "top_k": INT, "truncate_prompt_tokens": INT}
PROMPT_FIELDS = {"model", "system", "messages", "tools", "tool_choice", "thinking", "output_config"}
MESSAGE_FIELDS = PROMPT_FIELDS | set(SAMPLING_FIELDS) | {"max_tokens", "stop_sequences", "stream", "metadata",
                                                         "context_overflow"}
# Anthropic fields nvllm has nothing for: accepted only at values that ask for nothing more than it does.
NEUTRAL: dict[str, Callable[[Any], bool]] = {
    "cache_control": lambda v: v is None or isinstance(v, dict),   # the prefix cache needs no marker
    "service_tier": lambda v: v in (None, "auto", "standard_only"),
    "speed": lambda v: v in (None, "standard"),
    "container": lambda v: v is None,
    "mcp_servers": lambda v: v in (None, []),
    "context_management": lambda v: v is None,
    "diagnostics": lambda v: v is None,
    "inference_geo": lambda v: v is None,
}
TOOL_KEYS = {"name", "description", "input_schema", "type", "cache_control", "strict"}
_OPENAI_NAMES = [  # OpenAI chat's spelling (the shared readers', the engine's) -> Anthropic's
    (re.compile(r"tools\[(\d+)\]\.function\.parameters"), r"tools[\1].input_schema"),
    (re.compile(r"tools\[(\d+)\]\.function\."), r"tools[\1]."),
    (re.compile(r"tool_choice\.function\.name"), "tool_choice.name"),
    (re.compile(r"'required', a named function,"), "type 'any', 'tool' (a named tool)"),
    (re.compile(r"parallel_tool_calls"), "tool_choice.disable_parallel_tool_use"),
    (re.compile(r"response_format\.json_schema"), "output_config.format"),
    (re.compile(r"^chat_template_kwargs"), "thinking"),
    (re.compile(r"^stop\b"), "stop_sequences"),
    (re.compile(r"^(prompt_token_ids|prompt)\b"), "messages"),
]


def anthropic_name(text: str, origins: list[str] | None = None) -> str:
    """A field (or a message that starts with one) in Anthropic's spelling; origins: the Anthropic field
    each engine message came from, for `messages[i]` of the engine's list."""
    for pattern, repl in _OPENAI_NAMES:
        text = pattern.sub(repl, text)
    if origins:
        text = re.sub(r"^messages\[(\d+)\]",
                      lambda m: origins[int(m[1])] if int(m[1]) < len(origins) else m[0], text)
    return text


def field_refusal(e: FieldError) -> ApiError:
    return bad_request(anthropic_name(e.field or ""), anthropic_name(e.message), e.code)


@dataclass
class AnthropicRequest:
    """A /v1/messages body, checked: one engine request (app.py's Asked)."""
    prompt: Prompt
    params: SamplingParams
    tool_plan: ToolPlan | None
    constraint_param: str | None
    template_kwargs: dict[str, Any] | None
    origins: list[str]
    stream: bool = False
    user: str | None = None
    priority: int = 0
    stop_sequences: list[str] = field(default_factory=list)
    show_thinking: bool = True      # thinking.display "omitted": thinking blocks come back empty

    def choices(self) -> list[tuple[Prompt, SamplingParams]]:
        return [(self.prompt, self.params)]

    def refusal(self, e: InvalidParameter) -> ApiError:
        return anthropic_invalid(e, self.origins, self.constraint_param)


def anthropic_invalid(e: InvalidParameter, origins: list[str], constraint_param: str | None = None) -> ApiError:
    """The engine's refusal as a 400 naming Anthropic's field; origins: where each engine message came from,
    constraint_param: the field the request's constraint came from."""
    if e.field.startswith("structured") and constraint_param:
        if constraint_param == "tools":   # the tools' grammar means nothing to the client; the reason does
            return bad_request("tools", f"tools: a tool's input_schema cannot be used: {e.reason}")
        param = anthropic_name(constraint_param)
        return bad_request(param, f"{param} cannot be used: {e.reason}")
    name = anthropic_name(e.field)
    text = anthropic_name(str(e), origins)
    if not text.startswith(name):
        text = f"{name}: {text}"
    return bad_request(name, text)


def read_messages(body: dict[str, Any], st: Served) -> AnthropicRequest:
    """A /v1/messages body (ApiError 400 naming the field, 404 for another model)."""
    check_keys(body, MESSAGE_FIELDS, NEUTRAL)
    if body.get("max_tokens") is None:
        raise bad_request("max_tokens", "max_tokens is required: the most tokens the answer may have")
    values: dict[str, Any] = {"max_tokens": need("max_tokens", body["max_tokens"], INT)}
    for name, kind in SAMPLING_FIELDS.items():
        if body.get(name) is not None:
            values[name] = need(name, body[name], kind)
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise bad_request("stop_sequences", "stop_sequences must be an array of strings")
        values["stop"] = list(stops)
    try:
        if body.get("context_overflow") is not None:
            values["context_overflow"] = context_overflow(body["context_overflow"], "context_overflow")
        chat, origins, show = _chat(body, st, SamplingParams(**values), for_answer=True)
        planned = chat.plan(_template(st))
    except FieldError as e:
        raise field_refusal(e) from None
    req = AnthropicRequest(planned.prompt, planned.params, planned.tool_plan, planned.constraint_param,
                           chat.template_kwargs, origins, stop_sequences=values.get("stop", []), show_thinking=show)
    if body.get("stream") is not None:
        req.stream = need("stream", body["stream"], BOOL)
    metadata = body.get("metadata")
    if metadata is not None:
        need("metadata", metadata, OBJECT)
        only_keys("metadata", metadata, {"user_id"})
        if metadata.get("user_id") is not None:
            req.user = need("metadata.user_id", metadata["user_id"], STRING)[:256]
    return req


def read_count_tokens(body: dict[str, Any], st: Served) -> tuple[Prompt, list[str]]:
    """A /v1/messages/count_tokens body: the prompt a /v1/messages request of it would have, and the origins
    of its messages (for the engine's refusals)."""
    check_keys(body, PROMPT_FIELDS, NEUTRAL)
    try:
        chat, origins, _ = _chat(body, st, SamplingParams(), for_answer=False)
        return chat.plan(_template(st)).prompt, origins
    except FieldError as e:
        raise field_refusal(e) from None


def _template(st: Served) -> str | None:
    return st.engine.chat_template   # tells the tool-call format


def _chat(body: dict[str, Any], st: Served, params: SamplingParams,
          for_answer: bool) -> tuple[ChatRequest, list[str], bool]:
    """The shared ChatRequest of a body, the origins of its messages, and whether thinking is shown.
    for_answer false (count_tokens): how calls would be read does not matter, only the prompt."""
    check_model(body, st.model_name)
    conv = read_conversation(body.get("system"), body.get("messages"))
    tools = _tools(body.get("tools"))
    choice, parallel = _tool_choice(body.get("tool_choice"), bool(tools))
    if tools and not for_answer and choice in (None, "auto"):
        choice = "none"         # the same prompt, and no need for a model whose call format nvllm knows
    kwargs, show = _thinking(body.get("thinking"), params.max_tokens)
    chat = ChatRequest(conv.messages, params, tools, choice, parallel, template_kwargs=kwargs)
    chat.constraint = _output_format(body.get("output_config"))
    return chat, conv.origins, show


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """Anthropic's custom tools as OpenAI's function tools (their names and schemas checked by tool_plan)."""
    if tools is None:
        return None
    need("tools", tools, ARRAY)
    out = []
    for i, t in enumerate(tools):
        at = f"tools[{i}]"
        need(at, t, OBJECT)
        if t.get("type") not in (None, "custom"):
            raise bad_request(f"{at}.type", f"{at}.type {str(t['type'])[:48]!r} is not supported by nvllm: "
                                            "only custom tools (name, description, input_schema)",
                              code="unsupported_parameter")
        only_keys(at, t, TOOL_KEYS)
        if t.get("input_schema") is None:
            raise bad_request(f"{at}.input_schema", f"{at}.input_schema is required (a JSON Schema object)")
        fn = {"name": t.get("name"), "parameters": t["input_schema"]}
        for key in ("description", "strict"):
            if t.get(key) is not None:
                fn[key] = t[key]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any, has_tools: bool) -> tuple[Any, bool | None]:
    """(OpenAI's tool_choice, parallel_tool_calls) of Anthropic's tool_choice."""
    if choice is None:
        return None, None
    kind = _kind("tool_choice", choice, {"auto": {"disable_parallel_tool_use"}, "any": {"disable_parallel_tool_use"},
                                         "tool": {"name", "disable_parallel_tool_use"}, "none": set()})
    serial = choice.get("disable_parallel_tool_use")
    parallel = None if serial is None else not need("tool_choice.disable_parallel_tool_use", serial, BOOL)
    if kind in ("auto", "none") and not has_tools:
        return None, None        # asks for nothing a request without tools does not do already
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], parallel


def _kind(field: str, value: Any, keys: dict[str, set[str]]) -> str:
    """An object's type, one of keys', each type with the other keys it takes; 400 naming the field."""
    need(field, value, OBJECT)
    kind = value.get("type")
    if kind not in keys:
        names = ", ".join(repr(k) for k in list(keys)[:-1]) + f" or {list(keys)[-1]!r}"
        raise bad_request(f"{field}.type", f"{field}.type must be {names}, got {str(kind)[:40]!r}")
    unknown = sorted(set(value) - keys[kind] - {"type"})
    if unknown:
        raise bad_request(f"{field}.{unknown[0]}"[:80], f"{field}.{unknown[0][:64]} is not supported with type "
                                                         f"{kind!r}", code="unknown_parameter")
    return str(kind)


def _thinking(thinking: Any, max_tokens: int | None) -> tuple[dict[str, Any] | None, bool]:
    """(chat_template_kwargs, thinking shown) of Anthropic's thinking. The template switches thinking on or
    off (Qwen3's enable_thinking); budget_tokens is checked but max_tokens alone bounds the answer."""
    if thinking is None:
        return None, True
    kind = _kind("thinking", thinking, {"enabled": {"budget_tokens", "display"}, "adaptive": {"display"},
                                        "disabled": set()})
    if kind == "disabled":
        return {"enable_thinking": False}, True
    if kind == "enabled":
        budget = need("thinking.budget_tokens", thinking.get("budget_tokens"), INT)
        if budget < 1 or (max_tokens is not None and budget >= max_tokens):
            raise bad_request("thinking.budget_tokens", f"thinking.budget_tokens must be at least 1 and less "
                                                        f"than max_tokens, got {budget}")
    display = thinking.get("display")
    if display not in (None, "summarized", "omitted"):
        raise bad_request("thinking.display", f"thinking.display must be 'summarized' or 'omitted', "
                                              f"got {str(display)[:40]!r}")
    return {"enable_thinking": True}, display != "omitted"


def _output_format(config: Any) -> Constraint | None:
    """output_config.format {"type": "json_schema", "schema": {...}}: the answer follows the schema."""
    if config is None:
        return None
    need("output_config", config, OBJECT)
    only_keys("output_config", config, {"format", "effort"})
    if config.get("effort") is not None:
        raise bad_request("output_config.effort", "output_config.effort is not supported by nvllm",
                          code="unsupported_parameter")
    fmt = config.get("format")
    if fmt is None:
        return None
    need("output_config.format", fmt, OBJECT)
    if fmt.get("type") != "json_schema":
        raise bad_request("output_config.format.type", "output_config.format.type must be 'json_schema'")
    only_keys("output_config.format", fmt, {"type", "schema"})
    need("output_config.format.schema", fmt.get("schema"), OBJECT)
    return json_schema_constraint({"name": "output", "schema": fmt["schema"]}, "output_config.format")
