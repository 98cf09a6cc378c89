"""A Generate request an upstream answers (server/upstream/): the upstream speaks HTTP, so the request goes as an
OpenAI chat completion (a chat) or completion (a prompt, or token ids), always streamed, and its chunks come
back as GenerateResponses: the text, the reasoning, the tool calls, the finish reason and the usage (no token
ids: an OpenAI stream carries none). The metadata key x-nvllm-answered-by says where it was answered."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

from nvllm.server.upstream.forwarder import ANSWERED_BY_HEADER, CHAT_PATH, COMPLETIONS_PATH
from nvllm.server.upstream.upstream_client import DONE, UpstreamEvents, UpstreamFailed
from nvllm.v1 import nvllm_pb2 as pb

ANSWERED_BY_KEY = ANSWERED_BY_HEADER.lower()     # gRPC metadata keys are lower case

_FINISH = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH, "tool_calls": pb.FINISH_REASON_TOOL_CALLS,
           "abort": pb.FINISH_REASON_ABORT}
# SamplingParams fields an OpenAI-compatible server takes under the same name (vLLM's extras among them)
_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
             "seed", "max_tokens", "min_tokens", "ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
             "truncate_prompt_tokens")
_TOOL_CHOICE = {pb.ToolChoice.MODE_AUTO: "auto", pb.ToolChoice.MODE_NONE: "none",
                pb.ToolChoice.MODE_REQUIRED: "required"}


def openai_body(request: pb.GenerateRequest, model: str) -> tuple[str, dict[str, Any]]:
    """(the upstream's path, the body) for a Generate request: a chat completion for a chat, else a
    completion (token ids as OpenAI's token-array prompt)."""
    body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
    which = request.WhichOneof("input")
    if which == "chat":
        path = CHAT_PATH
        body["messages"] = [_message(m) for m in request.chat.messages]
    else:
        path = COMPLETIONS_PATH
        body["prompt"] = request.prompt if which == "prompt" else list(request.prompt_token_ids.ids)
    if request.HasField("sampling_params"):
        sp = request.sampling_params
        body.update({f: getattr(sp, f) for f in _SAMPLING if sp.HasField(f)})
        if sp.stop:
            body["stop"] = list(sp.stop)
        if sp.stop_token_ids:
            body["stop_token_ids"] = list(sp.stop_token_ids)
        if sp.logit_bias:
            body["logit_bias"] = {str(k): v for k, v in sp.logit_bias.items()}
    kind = request.structured.WhichOneof("kind") if request.HasField("structured") else None
    if kind == "json_schema":
        schema = json.loads(request.structured.json_schema)
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    elif kind == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif kind == "choice":
        body["structured_outputs"] = {"choice": list(request.structured.choice.choices)}
    elif kind is not None:       # regex, grammar: vLLM's names
        body["structured_outputs"] = {kind: getattr(request.structured, kind)}
    if request.chat_template_kwargs:
        body["chat_template_kwargs"] = json.loads(request.chat_template_kwargs)
    if request.tools:
        body["tools"] = [{"type": "function", "function": {
            "name": t.name, "description": t.description,
            "parameters": json.loads(t.parameters) if t.parameters else {"type": "object", "properties": {}}}}
            for t in request.tools]
    if request.HasField("tool_choice"):
        mode = request.tool_choice.mode
        body["tool_choice"] = {"type": "function", "function": {"name": request.tool_choice.function_name}} \
            if mode == pb.ToolChoice.MODE_FUNCTION else _TOOL_CHOICE.get(mode, "auto")
    if request.HasField("parallel_tool_calls"):
        body["parallel_tool_calls"] = request.parallel_tool_calls
    return path, body


def _message(m: pb.ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for c in m.tool_calls]
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.name:
        out["name"] = m.name
    return out


def forwardable(request: pb.GenerateRequest) -> bool:
    """Whether the request can be said in OpenAI's words (a chat's audio cannot: it is heard here first)."""
    return request.WhichOneof("input") is not None and \
        not (request.WhichOneof("input") == "chat" and any(m.audio for m in request.chat.messages))


async def generate_responses(events: UpstreamEvents, rid: str) -> AsyncGenerator[pb.GenerateResponse, None]:
    """The upstream's chunks as responses, one a chunk that says something; the stream closed when done.
    UpstreamFailed where the upstream breaks mid-stream."""
    held: pb.GenerateResponse | None = None     # the finish, until the usage that follows it joins it
    try:
        data: str | None = events.first
        while data is not None and data != DONE:
            r = _response(json.loads(data), rid)
            if r is not None and held is not None and r.HasField("usage") and not (r.text or r.tool_calls):
                held.usage.CopyFrom(r.usage)
                r = None
            if r is not None and held is not None:
                yield held
                held = None
            if r is not None and r.finish_reason and not r.HasField("usage"):
                held, r = r, None
            if r is not None:
                yield r
            data = await events.next_data()
        if held is not None:
            yield held
    except ValueError:
        raise UpstreamFailed(f"upstream {events.up.name} streamed an event that is not JSON") from None
    finally:
        await events.aclose()


def _response(chunk: Any, rid: str) -> pb.GenerateResponse | None:
    if not isinstance(chunk, dict):
        raise ValueError("not an object")
    if "error" in chunk:
        raise UpstreamFailed(f"upstream error: {str(chunk['error'])[:200]}")
    r = pb.GenerateResponse(request_id=rid)
    said = False
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        text = delta.get("content") if "delta" in choice else choice.get("text")
        if text:
            r.text += text
            said = True
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            r.reasoning_text += reasoning
            said = True
        for call in delta.get("tool_calls") or ():
            fn = call.get("function") or {}
            r.tool_calls.add(index=call.get("index", 0), id=call.get("id") or "", name=fn.get("name") or "",
                             arguments=fn.get("arguments") or "")
            said = True
        reason = choice.get("finish_reason")
        if reason:
            r.finish_reason = _FINISH.get(reason, pb.FINISH_REASON_STOP)
            said = True
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        r.usage.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        r.usage.completion_tokens = int(usage.get("completion_tokens") or 0)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        r.usage.cached_tokens = int(cached or 0)
        said = True
    return r if said else None
