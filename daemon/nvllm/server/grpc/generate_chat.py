"""A GenerateRequest's chat read into the chat request every front door builds (server/chat/chat_request.py):
its messages, tools, tool_choice, parallel_tool_calls and structured constraint put in OpenAI chat's shapes
and planned against the model's chat template, so one conversation with one set of tools gives the same
prompt, constraint and calls over gRPC as over HTTP. Refusals are FieldErrors naming the proto's fields
(generate_request.py makes them BadRequests); those from planning name OpenAI's spelling
(`tools[0].function.name`) and are renamed here.
"""

from __future__ import annotations

import json
import re
from typing import Any

from nvllm.sampling_params import SamplingParams
from nvllm.server.chat.chat_request import ChatRequest, PlannedChat
from nvllm.server.chat.field_error import FieldError, bad_field
from nvllm.server.chat.response_format import Constraint
from nvllm.v1 import nvllm_pb2 as pb

_MODES = {pb.ToolChoice.MODE_AUTO: "auto", pb.ToolChoice.MODE_NONE: "none",
          pb.ToolChoice.MODE_REQUIRED: "required"}
# OpenAI chat's field paths that the proto spells otherwise.
_RENAMES = ((re.compile(r"tools\[(\d+)\]\.function\.(\w+)"), r"tools[\1].\2"),
            (re.compile(r"tool_choice\.function\.name"), "tool_choice.function_name"))


def chat_messages(chat: pb.ChatMessages) -> list[dict[str, Any]]:
    """The proto's messages in OpenAI chat's shape (the engine's own): tool calls on assistant turns,
    tool_call_id and name on tool results. Roles and texts are the template's to check."""
    out = []
    for i, m in enumerate(chat.messages):
        at = f"chat.messages[{i}]"
        if m.audio:    # Generate hears it first (chat_audio.py); anywhere else it is not read
            raise bad_field(f"{at}.audio", f"{at}.audio is heard only by Generate (the voice query)")
        message: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            if m.role != "assistant":
                raise bad_field(f"{at}.tool_calls", f"{at}.tool_calls is only for assistant messages, "
                                                    f"got role {m.role[:32]!r}")
            message["tool_calls"] = [_call(c, f"{at}.tool_calls[{j}]") for j, c in enumerate(m.tool_calls)]
        for key in ("tool_call_id", "name"):
            value = getattr(m, key)
            if value and m.role != "tool":
                raise bad_field(f"{at}.{key}", f"{at}.{key} is only for tool messages, got role {m.role[:32]!r}")
            if value:
                message[key] = value
        out.append(message)
    return out


def _call(call: pb.ToolCall, at: str) -> dict[str, Any]:
    if not call.name:
        raise bad_field(f"{at}.name", f"{at}.name must name the function called")
    # Empty arguments are none; other text goes on as the model wrote it, as the HTTP API passes it.
    fn = {"name": call.name, "arguments": call.arguments or "{}"}
    return {"id": call.id or None, "type": "function", "function": fn}


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """The proto's tools as OpenAI's; a parameters text that is not JSON is refused here, the rest of
    each tool is tool_plan.py's to check."""
    out = []
    for i, t in enumerate(tools):
        fn: dict[str, Any] = {"name": t.name}
        if t.description:
            fn["description"] = t.description
        if t.parameters:
            try:
                fn["parameters"] = json.loads(t.parameters, parse_constant=_no_constant)
            except (ValueError, RecursionError) as e:
                raise bad_field(f"tools[{i}].parameters", f"tools[{i}].parameters is not valid JSON: "
                                                          f"{str(e)[:200]}") from None
        out.append({"type": "function", "function": fn})
    return out or None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def chat_tool_choice(request: pb.GenerateRequest) -> Any:
    """The proto's ToolChoice as OpenAI's tool_choice (None: unset, auto when tools are given)."""
    if not request.HasField("tool_choice"):
        return None
    mode, name = request.tool_choice.mode, request.tool_choice.function_name
    if mode == pb.ToolChoice.MODE_FUNCTION or (mode == pb.ToolChoice.MODE_UNSPECIFIED and name):
        return {"type": "function", "function": {"name": name}}   # tool_plan.py checks the name
    if mode == pb.ToolChoice.MODE_UNSPECIFIED:
        return None
    if mode not in _MODES:
        raise bad_field("tool_choice.mode", f"tool_choice.mode must be one of "
                                            f"{', '.join(pb.ToolChoice.Mode.keys())}, got {mode}")
    if name:
        raise bad_field("tool_choice.function_name", "tool_choice.function_name needs mode MODE_FUNCTION, "
                                                     f"got {pb.ToolChoice.Mode.Name(mode)}")
    return _MODES[mode]


def plan_chat(request: pb.GenerateRequest, params: SamplingParams, template_kwargs: dict[str, Any] | None,
              chat_template: str | None) -> PlannedChat:
    """The chat planned as the HTTP API plans it: the engine's prompt, the parameters with the one
    constraint the request asks for (its tool choice's or structured), and the plan its calls read back by."""
    constraint = None
    if params.structured is not None:
        # structured is gRPC's response_format: named by its kind when the engine refuses it.
        constraint = Constraint(params.structured, f"structured.{request.structured.WhichOneof('kind')}")
        params.structured = None
    parallel = request.parallel_tool_calls if request.HasField("parallel_tool_calls") else None
    chat = ChatRequest(chat_messages(request.chat), params, chat_tools(request.tools), chat_tool_choice(request),
                       parallel, constraint, template_kwargs)
    try:
        return chat.plan(chat_template)
    except FieldError as e:
        field = proto_path(e.field or "chat")
        message = e.message.replace(e.field, field) if e.field else e.message
        raise bad_field(field, message) from None


def proto_path(field: str) -> str:
    """A chat field's path in OpenAI's spelling as the proto's."""
    for pattern, repl in _RENAMES:
        field = pattern.sub(repl, field)
    return field
