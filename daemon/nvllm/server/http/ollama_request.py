"""Ollama's /api/chat and /api/generate -> nvllm: a body read into the shared ChatRequest (server/chat/
chat_request.py; the conversation by ollama_messages.py) or, raw, into a text prompt; ollama_response.py shapes
the answer.

  /api/chat messages, tools              the conversation, OpenAI's function tools (Ollama has no tool_choice:
                                         "auto", which needs a model whose call format nvllm knows)
  /api/generate prompt, system           a chat of the system message (where given) and the prompt, rendered
                                         by the model's own template; raw: the prompt as it is, no template
  format "json" / a JSON Schema          the answer constrained to any JSON object / to the schema
  think true / "low" "medium" "high"     chat_template_kwargs enable_thinking true (false: false); the
    / false                              thinking comes back apart where the daemon has a reasoning parser
  logprobs, top_logprobs                 the chosen tokens' log probabilities, with the top N alternatives
  truncate (default true)                a chat longer than the context drops its oldest turns (the system
                                         messages and the last turn kept); false refuses it
  options                                SamplingParams (OPTIONS below); the load-time ones and the runtime
                                         ones nvllm has nothing for are accepted where they ask for nothing it
                                         does not do (NEUTRAL_OPTIONS), everything else refused naming options.X

Options not given take the model's defaults (generation_config.json), as /v1 does, not Ollama's built-in
ones (its Modelfile PARAMETERs play the part of generation_config.json), so one request asks one thing of
either API. Refused, naming the field: images (nvllm serves text models), suffix (fill-in-the-middle),
template (nvllm uses the model's own chat template: a Go template cannot be run), context (Ollama's
deprecated token history: send the conversation to /api/chat), shift true (nvllm ends the answer at the
context's end rather than sliding it), the image-generation fields, and every unknown key.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nvllm.engine.prompt import Prompt
from nvllm.sampling_params import MAX_LOGPROBS, InvalidParameter, SamplingParams, StructuredSpec
from nvllm.server.chat.chat_request import ChatRequest
from nvllm.server.chat.field_error import FieldError
from nvllm.server.chat.response_format import Constraint
from nvllm.server.chat.tool_plan import ToolPlan
from nvllm.server.http.body import ARRAY, BOOL, INT, OBJECT, REAL, STRING, check_keys, json_type, need
from nvllm.server.http.errors import ApiError, bad_request
from nvllm.server.http.ollama_messages import no_images, read_messages
from nvllm.server.reading import Served

CHAT, GENERATE = "chat", "generate"
COMMON_FIELDS = {"model", "format", "options", "stream", "think", "logprobs", "top_logprobs", "truncate", "shift"}
CHAT_FIELDS = COMMON_FIELDS | {"messages", "tools"}
GENERATE_FIELDS = COMMON_FIELDS | {"prompt", "system", "raw", "images", "suffix", "template", "context"}
# Top-level fields nvllm has nothing for: accepted at the values that ask for nothing more.
NEUTRAL: dict[str, Callable[[Any], bool]] = {
    "width": lambda v: v is None, "height": lambda v: v is None, "steps": lambda v: v is None,  # image generation
    "debug_render_only": lambda v: v in (None, False),
}

# Ollama's options nvllm maps: option -> (SamplingParams field, JSON kind).
OPTIONS: dict[str, tuple[str, str]] = {
    "num_predict": ("max_tokens", INT), "temperature": ("temperature", REAL), "top_k": ("top_k", INT),
    "top_p": ("top_p", REAL), "min_p": ("min_p", REAL), "repeat_penalty": ("repetition_penalty", REAL),
    "repeat_last_n": ("penalty_last_n", INT), "presence_penalty": ("presence_penalty", REAL),
    "frequency_penalty": ("frequency_penalty", REAL), "seed": ("seed", INT), "stop": ("stop", ARRAY),
    "num_ctx": ("context_limit", INT),
}
_ANY_INT = lambda v: isinstance(v, int) and not isinstance(v, bool)     # noqa: E731
_ANY_BOOL = lambda v: isinstance(v, bool)                                # noqa: E731
_ANY_REAL = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)   # noqa: E731
# Ollama's options nvllm has nothing for: the load-time ones say how Ollama would load the model (nvllm loads
# it by its own settings, and the answer is the same) and are taken at any value of their type but the two
# that would load something else; the runtime ones only at the value that leaves sampling as it is.
NEUTRAL_OPTIONS: dict[str, Callable[[Any], bool]] = {
    "numa": _ANY_BOOL, "num_batch": _ANY_INT, "num_gpu": _ANY_INT, "main_gpu": _ANY_INT, "low_vram": _ANY_BOOL,
    "f16_kv": _ANY_BOOL, "logits_all": _ANY_BOOL, "use_mmap": _ANY_BOOL, "use_mlock": _ANY_BOOL,
    "num_thread": _ANY_INT, "num_gqa": _ANY_INT, "rope_frequency_base": lambda v: v == 0,
    "rope_frequency_scale": lambda v: v == 0,
    "vocab_only": lambda v: v is False, "embedding_only": lambda v: v is False,
    "typical_p": lambda v: v == 1, "tfs_z": lambda v: v == 1, "mirostat": lambda v: v == 0,
    "mirostat_tau": _ANY_REAL, "mirostat_eta": _ANY_REAL,     # mirostat's, read only when it is on
    "penalize_newline": _ANY_BOOL,     # Ollama no longer reads it either
    "num_keep": _ANY_INT,              # what a context shift keeps: nvllm does not shift
}
_FIELD_NAMES = {field: f"options.{option}" for option, (field, _) in OPTIONS.items()}
_FIELD_NAMES.update({"logprobs": "top_logprobs", "chat_template_kwargs": "think", "tool_choice": "tools",
                     "parallel_tool_calls": "tools"})


@dataclass
class OllamaRequest:
    """An /api/chat or /api/generate body, checked: one engine request (app.py's Asked)."""
    kind: str
    model: str                       # as the client named it (answers echo it)
    prompt: Prompt
    params: SamplingParams
    tool_plan: ToolPlan | None = None
    constraint_param: str | None = None
    template_kwargs: dict[str, Any] | None = None
    stream: bool = True              # Ollama streams unless told not to
    logprobs: bool = False
    priority: int = 0
    user: str | None = None
    leased_at: float = 0.0           # when the reader ran: the model leased (loaded, where it was not)

    def choices(self) -> list[tuple[Prompt, SamplingParams]]:
        return [(self.prompt, self.params)]

    def refusal(self, e: InvalidParameter) -> ApiError:
        return ollama_invalid(e, self.kind, self.constraint_param)


def ollama_name(field: str, kind: str) -> str:
    """A field of the engine's (or the shared readers') spelling in Ollama's."""
    if field in ("prompt", "prompt_token_ids", "messages"):
        return "messages" if kind == CHAT else "prompt"
    if field.startswith("messages") and kind == GENERATE:
        return "prompt"
    if field.startswith(("tools", "tool_choice")):
        return re.sub(r"^tool_choice.*", "tools", field)
    if field.startswith(("response_format", "structured")):
        return "format"
    return _FIELD_NAMES.get(field, field)


def ollama_invalid(e: InvalidParameter, kind: str, constraint_param: str | None = None) -> ApiError:
    """The engine's refusal as a 400 naming Ollama's field."""
    if e.field.startswith("structured") and constraint_param == "tools":
        return bad_request("tools", f"tools: a tool's parameters schema cannot be used: {e.reason}")
    name = ollama_name(e.field, kind)
    text = str(e)
    if text.startswith(e.field):
        text = name + text[len(e.field):]
    elif not text.startswith(name):
        text = f"{name}: {text}"
    for engine_name, field in (("max_model_len", "the model's context length"),
                               ("context_limit", "options.num_ctx"), ("max_tokens", "options.num_predict"),
                               ("context_overflow 'drop_oldest'", "truncate true")):
        text = text.replace(engine_name, field)
    return bad_request(name, text)


def _field_refusal(e: FieldError, kind: str) -> ApiError:
    name = ollama_name(e.field or "", kind)
    message = e.message
    if e.field == "tool_choice" and "'auto' needs" in message:
        message = ("tools: this model does not support tools in nvllm: its chat template has no tool-call format "
                   "nvllm knows (Qwen2.5/Qwen3's <tool_call>), and Ollama's API asks the model to choose between "
                   "text and a call")
    elif "cannot be combined with tool_choice" in message:
        message = (f"{name} cannot be combined with tools: with tools, a call the model starts is constrained to "
                   "them, and one answer takes one constraint")
    elif e.field and message.startswith(e.field):
        message = name + message[len(e.field):]
    return bad_request(name, message, e.code)


def read_chat(body: dict[str, Any], st: Served) -> OllamaRequest:
    """An /api/chat body (ApiError 400 naming the field)."""
    check_keys(body, CHAT_FIELDS, NEUTRAL)
    params, logprobs = _params(body, st)
    messages = read_messages(body.get("messages"))
    kwargs = _think(body.get("think"), st)
    chat = ChatRequest(messages, params, body.get("tools"), None, None, template_kwargs=kwargs)
    try:
        chat.constraint = _format(body.get("format"))
        planned = chat.plan(st.engine.chat_template)
    except FieldError as e:
        raise _field_refusal(e, CHAT) from None
    return OllamaRequest(CHAT, _model(body, st), planned.prompt, planned.params, planned.tool_plan,
                         planned.constraint_param, kwargs, _stream(body), logprobs, leased_at=time.monotonic())


def read_generate(body: dict[str, Any], st: Served) -> OllamaRequest:
    """An /api/generate body (ApiError 400 naming the field)."""
    check_keys(body, GENERATE_FIELDS, NEUTRAL)
    no_images(body.get("images"), "images")
    for name, why in (("suffix", "suffix (fill-in-the-middle) is not supported by nvllm"),
                      ("template", "template is not supported by nvllm, which renders the prompt with the model's "
                                   "own chat template (a Go template cannot be run); leave it out, or send the "
                                   "formatted text with raw: true"),
                      ("context", "context (Ollama's deprecated token history) is not supported by nvllm: send the "
                                  "conversation to /api/chat, or the whole text with raw: true")):
        if body.get(name) not in (None, "", []):
            raise bad_request(name, why, code="unsupported_parameter")
    params, logprobs = _params(body, st)
    text = need("prompt", body.get("prompt"), STRING) if body.get("prompt") is not None else ""
    raw = body.get("raw") is not None and need("raw", body["raw"], BOOL)
    system = body.get("system")
    if system is not None:
        need("system", system, STRING)
    try:
        constraint = _format(body.get("format"))
    except FieldError as e:
        raise _field_refusal(e, GENERATE) from None
    req = OllamaRequest(GENERATE, _model(body, st), text, params, stream=_stream(body), logprobs=logprobs,
                        leased_at=time.monotonic())
    if raw:
        for name in ("system", "think"):
            if body.get(name) is not None:
                raise bad_request(name, f"{name} is part of the chat template, which raw: true leaves out",
                                  code="unsupported_parameter")
    else:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        req.template_kwargs = _think(body.get("think"), st)
        req.prompt = {"messages": messages}
        if req.template_kwargs is not None:
            req.prompt["chat_template_kwargs"] = req.template_kwargs
    if constraint is not None:
        params.structured, req.constraint_param = constraint.spec, constraint.param
    return req


def _model(body: dict[str, Any], st: Served) -> str:
    model = body.get("model")
    return model if isinstance(model, str) and model else st.model_name


def _stream(body: dict[str, Any]) -> bool:
    return True if body.get("stream") is None else bool(need("stream", body["stream"], BOOL))


def _params(body: dict[str, Any], st: Served) -> tuple[SamplingParams, bool]:
    """The SamplingParams of `options`, `truncate` and the logprobs asked for; whether logprobs are."""
    values: dict[str, Any] = {}
    options = body.get("options")
    if options is not None:
        values = _options(need("options", options, OBJECT), st)
    truncate = body.get("truncate")
    values["context_overflow"] = "error" if truncate is not None and not need("truncate", truncate, BOOL) \
        else "drop_oldest"
    if body.get("shift") is not None and need("shift", body["shift"], BOOL):
        raise bad_request("shift", "shift (sliding the context along once the answer reaches it) is not supported "
                                   "by nvllm: the answer ends at the context's end (done_reason length)",
                          code="unsupported_parameter")
    logprobs = body.get("logprobs") is not None and need("logprobs", body["logprobs"], BOOL)
    top = body.get("top_logprobs")
    if top is not None:
        need("top_logprobs", top, INT)
        if not 0 <= top <= MAX_LOGPROBS:
            raise bad_request("top_logprobs", f"top_logprobs must be an integer in [0, {MAX_LOGPROBS}], got {top}")
        if top and not logprobs:
            raise bad_request("top_logprobs", "top_logprobs needs logprobs: true")
    if logprobs:
        values["logprobs"] = top or 0
    return SamplingParams(**values), logprobs


def _options(options: dict[str, Any], st: Served) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, value in options.items():
        at = f"options.{key}"[:80]
        if value is None:
            continue
        if key in NEUTRAL_OPTIONS:
            if not NEUTRAL_OPTIONS[key](value):
                raise bad_request(at, f"{at} = {json.dumps(value)[:40]} is not supported by nvllm",
                                  code="unsupported_parameter")
            continue
        if key not in OPTIONS:
            raise bad_request(at, f"{at}: unknown option", code="unknown_parameter")
        field, kind = OPTIONS[key]
        values[field] = need(at, value, kind)
    stop = values.get("stop")
    if stop is not None and not all(isinstance(s, str) for s in stop):
        raise bad_request("options.stop", "options.stop must be an array of strings")
    predict = values.pop("max_tokens", None)
    if predict is not None:
        if predict < -2 or predict == 0:
            raise bad_request("options.num_predict", f"options.num_predict must be an integer >= 1, -1 (no limit) "
                                                     f"or -2 (fill the context), got {predict}")
        if predict > 0:
            values["max_tokens"] = predict
    if values.get("seed") is not None and values["seed"] < 0:
        del values["seed"]                  # Ollama's -1: a random seed, as unset is
    window = values.get("penalty_last_n")
    if window is not None and window < 0:
        if window != -1:
            raise bad_request("options.repeat_last_n", f"options.repeat_last_n must be an integer >= 0 (0: no "
                                                       f"penalty) or -1 (the whole context), got {window}")
        limit = st.engine.max_model_len
        values["penalty_last_n"] = min(limit, values["context_limit"]) if values.get("context_limit") else limit
    return values


def _think(think: Any, st: Served) -> dict[str, Any] | None:
    """chat_template_kwargs of Ollama's think: true, a level (taken as true), or false."""
    if think is None:
        return None
    if isinstance(think, str):
        if think not in ("low", "medium", "high"):
            raise bad_request("think", f"think must be true, false, 'low', 'medium' or 'high', got {think[:32]!r}")
        think = True
    need("think", think, BOOL)
    if think and not st.reasoning_parser:
        raise bad_request("think", "think: this daemon reads no thinking apart from the answer (it has no reasoning "
                                   "parser: --reasoning-parser, server.reasoning_parser)",
                          code="unsupported_parameter")
    return {"enable_thinking": think}


def _format(fmt: Any) -> Constraint | None:
    """format: "json" (any JSON object), a JSON Schema object, or "" / none (free text)."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return Constraint(StructuredSpec("json_object"), "format")
    if not isinstance(fmt, dict):
        raise FieldError("format", f"format must be \"json\" or a JSON Schema object, got "
                                   f"{json.dumps(fmt)[:40] if isinstance(fmt, str) else json_type(fmt)}")
    try:
        return Constraint(StructuredSpec("json_schema", json.dumps(fmt, ensure_ascii=False)), "format")
    except (TypeError, ValueError, RecursionError) as e:
        raise FieldError("format", f"format must be JSON: {e}") from None
