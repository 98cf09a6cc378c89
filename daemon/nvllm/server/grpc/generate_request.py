"""A GenerateRequest read into the engine's arguments: the checks that need no tokenizer (size, request
id, model name, input; BadRequest naming the proto field), and the proto's SamplingParams and structured
constraint mapped onto sampling_params.SamplingParams by field name. A chat, with its tools, is planned
as the HTTP API plans one (generate_chat.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from nvllm.sampling_params import InvalidParameter, SamplingParams, StructuredSpec
from nvllm.server.chat.field_error import FieldError
from nvllm.server.chat.tool_plan import ToolPlan
from nvllm.server.grpc.generate_chat import chat_messages, plan_chat
from nvllm.server.models.keep_alive import keep_alive_seconds
from nvllm.v1 import nvllm_pb2 as pb

MAX_REQUEST_ID_CHARS = 128

# The proto's SamplingParams fields share SamplingParams' names, so neither list is written here.
_SAMPLING_FIELDS = frozenset(pb.SamplingParams.DESCRIPTOR.fields_by_name)


class BadRequest(Exception):
    """A request refused before it reaches the engine; `field` is the proto field's path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class GenerateArgs:
    """A request read: its engine prompt and parameters, and what reading the answer needs."""
    input_field: str                 # "prompt", "chat" or "prompt_token_ids"
    prompt: Any                      # text, token ids, or {"messages", "tools", "chat_template_kwargs"}
    params: SamplingParams
    tool_plan: ToolPlan | None = None     # a chat with tools: how its calls read back
    constraint_param: str | None = None   # a chat's: where its constraint came from (structured.<kind>, tools)


def read_request(request: pb.GenerateRequest, rid: str, model_name: str, max_message_bytes: int,
                 chat_template: str | None = None) -> GenerateArgs:
    """Checks that need no tokenizer. chat_template: the model's template text, which tells its tool-call
    format (server/chat/tool_plan.py)."""
    check_envelope(request, rid, max_message_bytes)
    check_model(request.model, model_name)
    which = request.WhichOneof("input")
    if which is None:
        raise BadRequest("input", "input must be set: one of prompt, chat or prompt_token_ids")
    if which != "chat":
        check_chat_only(request, which)
    if which == "prompt" and not request.prompt:
        raise BadRequest("prompt", "prompt must not be empty")
    if which == "prompt_token_ids" and not request.prompt_token_ids.ids:
        raise BadRequest("prompt_token_ids.ids", "prompt_token_ids.ids must hold at least one id")
    if which == "chat" and not request.chat.messages:
        raise BadRequest("chat.messages", "chat.messages must hold at least one message")
    kwargs = template_kwargs(request.chat_template_kwargs) if request.chat_template_kwargs else None
    try:
        params = sampling_params_from_proto(request)
    except (TypeError, ValueError) as e:
        raise BadRequest("sampling_params", f"sampling_params: {e}") from None
    if which == "prompt":
        return GenerateArgs(which, request.prompt, params)
    if which == "prompt_token_ids":
        return GenerateArgs(which, [int(t) for t in request.prompt_token_ids.ids], params)
    try:
        planned = plan_chat(request, params, kwargs, chat_template)
    except FieldError as e:
        raise BadRequest(e.field or "chat", e.message) from None
    return GenerateArgs(which, planned.prompt, planned.params, planned.tool_plan, planned.constraint_param)


def check_chat_only(request: pb.GenerateRequest, which: str) -> None:
    """What only a chat can use, refused on other input rather than ignored."""
    given = {"chat_template_kwargs": bool(request.chat_template_kwargs), "tools": bool(request.tools),
             "tool_choice": request.HasField("tool_choice"),
             "parallel_tool_calls": request.HasField("parallel_tool_calls"),
             "sampling_params.context_overflow": request.sampling_params.context_overflow == "drop_oldest"}
    for name, set_ in given.items():
        if set_:
            raise BadRequest(name, f"{name} needs chat input (only a chat is rendered by the template and has "
                                   f"turns), got {which}")


def read_messages(chat: pb.ChatMessages) -> list[dict[str, Any]]:
    """A chat's messages in OpenAI chat's shape, as Generate reads them (for Tokenize)."""
    try:
        return chat_messages(chat)
    except FieldError as e:
        raise BadRequest(e.field or "chat", e.message) from None


def check_envelope(request: pb.GenerateRequest, rid: str, max_message_bytes: int) -> None:
    """What is checked before anything else, the model included: the request's size and its id."""
    size = request.ByteSize()
    if size > max_message_bytes:
        field = oversized_field(request)
        raise BadRequest(field, f"{field} makes the request {size} bytes; a request may be at most "
                                f"{max_message_bytes} bytes (server.max_message_bytes)")
    if len(rid) > MAX_REQUEST_ID_CHARS:
        raise BadRequest("request_id", f"request_id must be at most {MAX_REQUEST_ID_CHARS} characters, "
                                       f"got {len(rid)}")


def read_keep_alive(text: str) -> float | None:
    """A request's keep_alive in seconds (None: empty, the model's own); BadRequest naming keep_alive."""
    if not text:
        return None
    try:
        return keep_alive_seconds(text)
    except FieldError as e:
        raise BadRequest("keep_alive", e.message) from None


def check_model(model: str, model_name: str) -> None:
    """A request's model field: empty or the served model's name."""
    if model and model != model_name:
        raise BadRequest("model", f"model must be empty or {model_name!r} (the served model), got {model[:64]!r}")


def template_kwargs(text: str) -> dict[str, Any]:
    """chat_template_kwargs' JSON text as an object; whether its keys may be used is the template's to say."""
    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")
    try:
        value = json.loads(text, parse_constant=no_constant)
    except (ValueError, RecursionError) as e:
        raise BadRequest("chat_template_kwargs", f"chat_template_kwargs is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(value, dict):
        raise BadRequest("chat_template_kwargs", "chat_template_kwargs must be a JSON object, "
                                                 f"got {type(value).__name__}")
    return value


def sampling_params_from_proto(request: pb.GenerateRequest) -> SamplingParams:
    """The proto's SamplingParams as our dataclass; unset fields keep their defaults (None = model's).
    ListFields gives the optional scalars that are set and the repeated fields that are not empty."""
    sp = request.sampling_params
    params = SamplingParams(**{f.name: _field_value(f, v) for f, v in sp.ListFields()})
    params.structured = structured_from_proto(request)
    return params


def _field_value(f: Any, v: Any) -> Any:
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        return dict(v)   # logit_bias
    return list(v) if f.is_repeated else v


def structured_from_proto(request: pb.GenerateRequest) -> StructuredSpec | None:
    """GenerateRequest.structured as the engine's constraint (None: free text). Whether it compiles is the
    engine's to say (INVALID_ARGUMENT naming structured.<kind>)."""
    kind = request.structured.WhichOneof("kind") if request.HasField("structured") else None
    if kind is None:
        return None
    if kind == "json_object":
        if not request.structured.json_object:
            raise BadRequest("structured.json_object",
                             "structured.json_object must be true (leave structured unset for free text)")
        return StructuredSpec("json_object")
    if kind == "choice":
        return StructuredSpec("choice", tuple(request.structured.choice.choices))
    return StructuredSpec(kind, getattr(request.structured, kind))


def proto_field(name: str, input_field: str) -> str:
    """The proto path of a field an InvalidParameter names."""
    if name in _SAMPLING_FIELDS:
        return f"sampling_params.{name}"
    if name in ("prompt", "prompt_token_ids"):
        return input_field    # a prompt too long for the model: blame what the client sent
    if name == "messages":
        return "chat.messages"
    return name


def invalid_message(e: InvalidParameter, input_field: str, constraint_param: str | None = None) -> str:
    if constraint_param == "tools" and e.field.startswith("structured"):
        # The constraint was built from the tools; its text means nothing to the client, the reason does.
        return f"tools: a function's parameters schema cannot be used: {e.reason}"
    field = proto_field(e.field, input_field)
    text = str(e)
    return field + text[len(e.field):] if text.startswith(e.field) else f"{field}: {text}"


def oversized_field(request: pb.GenerateRequest) -> str:
    """The field that makes a request big, for the size error."""
    sizes = {"request_id": len(request.request_id.encode()), "model": len(request.model.encode())}
    which = request.WhichOneof("input")
    if which is not None:
        sizes[which] = getattr(request, which).ByteSize() if which != "prompt" else len(request.prompt.encode())
    if request.HasField("sampling_params"):
        sizes["sampling_params.stop"] = sum(len(s.encode()) for s in request.sampling_params.stop)
        sizes["sampling_params.stop_token_ids"] = 10 * len(request.sampling_params.stop_token_ids)
    if request.HasField("structured"):
        sizes["structured"] = request.structured.ByteSize()
    sizes["chat_template_kwargs"] = len(request.chat_template_kwargs.encode())
    sizes["tools"] = sum(t.ByteSize() for t in request.tools)
    return max(sizes, key=sizes.__getitem__)

