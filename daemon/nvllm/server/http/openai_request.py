"""OpenAI's JSON -> nvllm: a /v1/chat/completions or /v1/completions request body to (prompts,
SamplingParams, options); openai_response.py shapes the answer.

Every parameter is either mapped or refused with 400 naming it: an unknown key, or a known OpenAI
parameter nvllm does not implement set to anything but its neutral value, is never silently ignored.
Types are checked here (400 naming the parameter); ranges are checked by SamplingParams itself, whose
field names are OpenAI's (and vLLM's), so its InvalidParameter names the parameter too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nvllm.sampling_params import MAX_LOGPROBS, InvalidParameter, SamplingParams
from nvllm.server.chat.chat_request import ChatRequest, context_overflow
from nvllm.server.chat.field_error import FieldError
from nvllm.server.chat.response_format import parse_constraint
from nvllm.server.chat.tool_plan import ToolPlan
from nvllm.server.http.body import BOOL, INT, OBJECT, REAL, STRING, check_keys, check_model, json_type, need
from nvllm.server.http.errors import ApiError, bad_request

CHAT, COMPLETION = "chat", "completion"
COMPLETION_DEFAULT_MAX_TOKENS = 16     # OpenAI's (and vLLM's) default for /v1/completions
MESSAGE_KEYS = {"role", "content", "tool_calls", "tool_call_id", "name"}
ROLE_ALIASES = {"developer": "system"}   # OpenAI's newer name for the system role

# Sampling parameters passed to SamplingParams under the same name, with their JSON type.
SAMPLING_FIELDS: dict[str, str] = {
    "temperature": REAL, "top_p": REAL, "top_k": INT, "min_p": REAL, "repetition_penalty": REAL,
    "presence_penalty": REAL, "frequency_penalty": REAL, "seed": INT, "min_tokens": INT,
    "ignore_eos": BOOL, "skip_special_tokens": BOOL, "include_stop_str_in_output": BOOL,
    "disable_speculation": BOOL, "truncate_prompt_tokens": INT,
}
COMMON_FIELDS = {"model", "n", "stream", "stream_options", "stop", "stop_token_ids", "max_tokens", "user",
                 "logit_bias", "priority", *SAMPLING_FIELDS}
# Constraints (response_format, structured_outputs) and tools: server/chat/response_format.py, tool_plan.py.
CONSTRAINT_FIELDS = {"response_format", "structured_outputs"}
TOOL_FIELDS = {"tools", "tool_choice", "parallel_tool_calls"}
CHAT_FIELDS = COMMON_FIELDS | CONSTRAINT_FIELDS | TOOL_FIELDS | {"messages", "max_completion_tokens", "logprobs",
                                                                 "top_logprobs", "chat_template_kwargs",
                                                                 "context_overflow"}
COMPLETION_FIELDS = COMMON_FIELDS | CONSTRAINT_FIELDS | {"prompt", "logprobs", "echo", "best_of", "suffix"}

# OpenAI parameters nvllm does not implement: accepted only at the value that asks for nothing.
NEUTRAL: dict[str, Callable[[Any], bool]] = {
    "tools": lambda v: v is None or v == [],
    "tool_choice": lambda v: v is None or v == "none",
    "parallel_tool_calls": lambda v: v is None,
    "functions": lambda v: v is None or v == [],
    "function_call": lambda v: v is None or v == "none",
    "response_format": lambda v: v is None or v == {"type": "text"},
    "service_tier": lambda v: v in (None, "auto", "default"),
    "store": lambda v: v in (None, False),
    "metadata": lambda v: v is None or v == {},
    "modalities": lambda v: v is None or v == ["text"],
    "audio": lambda v: v is None,
    "prediction": lambda v: v is None,
    "reasoning_effort": lambda v: v is None,
    "web_search_options": lambda v: v is None,
}


@dataclass
class ParsedRequest:
    """What a request body asks for, checked; one engine request per (prompt, choice)."""
    kind: str
    prompts: list[Any]                 # engine prompts: text, token ids, or {"messages": [...]}
    params: SamplingParams
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False             # logprobs asked for (chat: logprobs=true; completions: logprobs=N)
    echo: bool = False
    max_tokens_name: str = "max_tokens"  # the parameter max_tokens came in, for errors
    user: str | None = None
    priority: int = 0                  # vLLM's: lower runs earlier; the engine checks its range
    tool_plan: ToolPlan | None = None   # chat with tools: the prompt's tools, the constraint, how calls read back
    constraint_param: str | None = None  # the parameter the engine's constraint came from, for its errors
    template_kwargs: dict[str, Any] | None = None  # chat_template_kwargs: extra variables for the template

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.n

    def choice(self, index: int) -> tuple[Any, SamplingParams]:
        """(prompt, params) of choice `index` (prompt-major as OpenAI numbers them). Choices of one
        prompt share its pages through the prefix cache; a given seed becomes seed, seed+1, ..."""
        prompt = self.prompts[index // self.n]
        i = index % self.n
        if i == 0 or self.params.seed is None:
            return prompt, self.params
        return prompt, dataclasses.replace(self.params, seed=self.params.seed + i,
                                           stop=list(self.params.stop), stop_token_ids=list(self.params.stop_token_ids))

    def choices(self) -> list[tuple[Any, SamplingParams]]:
        return [self.choice(i) for i in range(self.num_choices)]

    def refusal(self, e: InvalidParameter) -> ApiError:
        return invalid(e, self)

    def param_name(self, field_name: str) -> str:
        """The request parameter an InvalidParameter's field stands for."""
        if field_name == "max_tokens":
            return self.max_tokens_name
        if field_name == "logprobs":
            return "top_logprobs" if self.kind == CHAT else "logprobs"
        if field_name in ("prompt", "prompt_token_ids"):
            return "messages" if self.kind == CHAT else "prompt"
        if field_name.startswith("structured") and self.constraint_param:
            return self.constraint_param
        return field_name


def invalid(e: InvalidParameter, req: ParsedRequest) -> ApiError:
    """An engine-side refusal as 400 naming the request's parameter."""
    name = req.param_name(e.field)
    text = str(e)
    if name == "tools" and e.field.startswith("structured"):
        # The constraint was built from the tools; its text means nothing to the client, the reason does.
        return bad_request(name, f"tools: a function's parameters schema cannot be used: {e.reason}")
    if name != e.field and text.startswith(e.field):
        text = name + text[len(e.field):]
    return bad_request(name, text)


def _common(body: dict[str, Any], kind: str, model_name: str, max_choices: int) -> ParsedRequest:
    """The parameters both endpoints share; prompts are filled in by the caller."""
    check_model(body, model_name)
    values: dict[str, Any] = {}
    for name, kind_text in SAMPLING_FIELDS.items():
        v = body.get(name)
        if v is not None:
            values[name] = need(name, v, kind_text)
    stop = body.get("stop")
    if stop is not None:
        if not isinstance(stop, (str, list)):
            raise bad_request("stop", f"stop must be a string or an array of strings, got {json_type(stop)}")
        values["stop"] = stop
    ids = body.get("stop_token_ids")
    if ids is not None:
        if not isinstance(ids, list):
            raise bad_request("stop_token_ids", f"stop_token_ids must be an array of integers, got {json_type(ids)}")
        values["stop_token_ids"] = ids
    bias = body.get("logit_bias")
    if bias is not None:
        values["logit_bias"] = _logit_bias(bias)
    req = ParsedRequest(kind, [], SamplingParams(**values))
    n = body.get("n")
    if n is not None:
        need("n", n, INT)
        if not 1 <= n <= max_choices:
            raise bad_request("n", f"n must be an integer in [1, {max_choices}] (scheduler.max_num_seqs), got {n}")
        req.n = n
    if body.get("stream") is not None:
        req.stream = need("stream", body["stream"], BOOL)
    options = body.get("stream_options")
    if options is not None:
        need("stream_options", options, OBJECT)
        if not req.stream:
            raise bad_request("stream_options", "stream_options is only allowed with stream: true")
        for key, value in options.items():
            if key == "include_usage":
                req.include_usage = need("stream_options.include_usage", value, BOOL)
            elif key != "continuous_usage_stats" or value not in (None, False):
                raise bad_request(f"stream_options.{key}"[:80], f"unknown stream option {key[:64]!r}",
                                  code="unknown_parameter")
    if body.get("user") is not None:
        req.user = need("user", body["user"], STRING)[:256]
    if body.get("priority") is not None:
        req.priority = need("priority", body["priority"], INT)
    return req


def _logit_bias(bias: Any) -> dict[int, Any]:
    """OpenAI's {"token id as a string": bias} as {id: bias}; ranges are SamplingParams' to check."""
    need("logit_bias", bias, OBJECT)
    out: dict[int, Any] = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit() and len(key) < 12):
            raise bad_request("logit_bias", f"logit_bias keys must be token ids, got {key[:32]!r}")
        out[int(key)] = value
    return out


def _max_tokens(body: dict[str, Any], req: ParsedRequest, names: tuple[str, ...], default: int | None) -> None:
    for name in names:
        v = body.get(name)
        if v is not None:
            req.params.max_tokens = need(name, v, INT)
            req.max_tokens_name = name
            return
    req.params.max_tokens = default


def parse_chat(body: dict[str, Any], model_name: str, max_choices: int,
               chat_template: str | None = None) -> ParsedRequest:
    """chat_template: the model's template text, which tells its tool-call format (tool_plan.py)."""
    check_keys(body, CHAT_FIELDS, NEUTRAL)
    req = _common(body, CHAT, model_name, max_choices)
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        # Its keys are the template's to check (the engine names one that overrides its own variables).
        req.template_kwargs = need("chat_template_kwargs", kwargs, OBJECT)
    chat = ChatRequest(chat_messages(body.get("messages")), req.params, body.get("tools"), body.get("tool_choice"),
                       body.get("parallel_tool_calls"), template_kwargs=req.template_kwargs)
    try:
        if body.get("context_overflow") is not None:
            req.params.context_overflow = context_overflow(body["context_overflow"], "context_overflow")
        chat.constraint = parse_constraint(body)
        planned = chat.plan(chat_template)
    except FieldError as e:
        raise bad_request(e.field, e.message, e.code) from None
    req.prompts = [planned.prompt]
    req.tool_plan = planned.tool_plan
    req.constraint_param = planned.constraint_param
    # max_completion_tokens is OpenAI's current name; max_tokens its deprecated one.
    _max_tokens(body, req, ("max_completion_tokens", "max_tokens"), None)
    if body.get("logprobs") is not None:
        req.logprobs = need("logprobs", body["logprobs"], BOOL)
    top = body.get("top_logprobs")
    if top is not None:
        need("top_logprobs", top, INT)
        if not req.logprobs:
            raise bad_request("top_logprobs", "top_logprobs needs logprobs: true")
        if not 0 <= top <= MAX_LOGPROBS:
            raise bad_request("top_logprobs", f"top_logprobs must be an integer in [0, {MAX_LOGPROBS}], got {top}")
    if req.logprobs:
        req.params.logprobs = top or 0
    return req


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """Shape checks the engine's own checks (roles, content parts, tool calls) do not make: the keys."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages", "messages must be a non-empty array of messages"
                          if isinstance(messages, list) or messages is None
                          else f"messages must be an array of messages, got {json_type(messages)}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}]", f"messages[{i}] must be an object, got {json_type(m)}")
        for key in m:
            if key not in MESSAGE_KEYS:
                raise bad_request(f"messages[{i}].{key}"[:80], f"messages[{i}].{key[:64]} is not supported",
                                  code="unknown_parameter")
        role = m.get("role")
        if role in ROLE_ALIASES:
            m = {**m, "role": ROLE_ALIASES[role]}
        if m.get("name") is not None and m.get("role") != "tool":
            raise bad_request(f"messages[{i}].name", f"messages[{i}].name is only supported on tool messages",
                              code="unsupported_parameter")
        out.append(m)
    return out


def parse_completion(body: dict[str, Any], model_name: str, max_choices: int) -> ParsedRequest:
    check_keys(body, COMPLETION_FIELDS, NEUTRAL)
    req = _common(body, COMPLETION, model_name, max_choices)
    req.prompts = _prompts(body.get("prompt"))
    try:
        constraint = parse_constraint(body)
    except FieldError as e:
        raise bad_request(e.field, e.message, e.code) from None
    if constraint is not None:
        req.params.structured = constraint.spec
        req.constraint_param = constraint.param
    if req.num_choices > max_choices:
        raise bad_request("n", f"{len(req.prompts)} prompts x n={req.n} make {req.num_choices} choices; "
                               f"at most {max_choices} (scheduler.max_num_seqs)")
    _max_tokens(body, req, ("max_tokens",), COMPLETION_DEFAULT_MAX_TOKENS)
    best_of = body.get("best_of")
    if best_of is not None and need("best_of", best_of, INT) != req.n:
        raise bad_request("best_of", "best_of other than n is not supported by nvllm", code="unsupported_parameter")
    if body.get("suffix") is not None:
        raise bad_request("suffix", "suffix is not supported by nvllm", code="unsupported_parameter")
    lp = body.get("logprobs")
    if lp is not None:
        need("logprobs", lp, INT)
        if not 0 <= lp <= MAX_LOGPROBS:
            raise bad_request("logprobs", f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {lp}")
        req.logprobs = True
        req.params.logprobs = lp
    if body.get("echo") is not None:
        req.echo = need("echo", body["echo"], BOOL)
    if req.echo:
        if req.logprobs:
            raise bad_request("echo", "echo with logprobs (the prompt's logprobs) is not supported by nvllm",
                              code="unsupported_parameter")
        if any(not isinstance(p, str) for p in req.prompts):
            raise bad_request("echo", "echo needs text prompts (nvllm does not echo token-id prompts)",
                              code="unsupported_parameter")
    return req


def _prompts(prompt: Any) -> list[Any]:
    """A string, an array of strings, an array of token ids, or an array of arrays of token ids."""
    shape = "prompt must be a string, an array of strings, an array of token ids or an array of arrays of them"
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise bad_request("prompt", shape + (", got an empty array" if isinstance(prompt, list)
                                             else f", got {json_type(prompt)}"))
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [list(prompt)]
    if all(isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
           for p in prompt):
        return [list(p) for p in prompt]
    raise bad_request("prompt", shape)
