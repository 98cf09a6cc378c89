"""nvllm -> Anthropic's Messages API: a request's outputs as the message object, or its server-sent events,
and every refusal in Anthropic's error shape (the request is read by anthropic_request.py).

The answer is read by server/chat/answer.py, as every front door reads it: thinking (with the daemon's
reasoning parser), text, and tool calls (with tools). Whole, its content is a thinking block, a text block
and a tool_use block per call, each where it has anything. Streamed, the events come as Anthropic sends
them: message_start, ping, then per block content_block_start, its deltas (thinking_delta, text_delta,
input_json_delta) and content_block_stop, then message_delta (the stop reason, the output tokens) and
message_stop; a failure mid-stream is an error event.

usage counts as Anthropic's does: input_tokens the prompt tokens the prefix cache did not hold,
cache_read_input_tokens those it did (their sum is what count_tokens answers); with context_overflow
"drop_oldest", nvllm's dropped_prompt_tokens too.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse, Response

from nvllm.engine.outputs import RequestOutput
from nvllm.server.chat.answer import ARGUMENTS, CALL, REASONING, TEXT, AnswerStream, read_answer
from nvllm.server.http.anthropic_request import AnthropicRequest, read_messages
from nvllm.server.http.dialect import Dialect, Event
from nvllm.server.http.errors import ApiError
from nvllm.server.reading import Served

_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error",
    500: "api_error", 503: "overloaded_error",     # Anthropic's overload is 529; the daemon keeps 503
}


def error_body(e: ApiError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(e.status, "api_error"), "message": e.message}}


def anthropic_refused(e: ApiError) -> Response:
    """The refusal with the status and headers (Retry-After, WWW-Authenticate) OpenAI's shape gets."""
    headers = {k: v for k, v in e.response().headers.items() if k in ("retry-after", "www-authenticate")}
    return JSONResponse(error_body(e), status_code=e.status, headers=headers)


def tool_use_id(call_id: str) -> str:
    """Anthropic's id for a call (the shared reader names them call_...)."""
    return "toolu_" + call_id.removeprefix("call_")


def tool_input(arguments: str) -> Any:
    """A call's input: the arguments' JSON as an object (the constraint makes it one)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {"value": value}


def _event(kind: str, **payload: Any) -> Event:
    return {"event": kind, "data": json.dumps({"type": kind, **payload}, ensure_ascii=False)}


class MessageBuilder:
    """One request's message, whole or as events, from the engine's outputs (app.py's Answering)."""

    def __init__(self, req: AnthropicRequest, request_id: str, model_name: str, reasoning_parser: str = "",
                 thinks: bool = True) -> None:
        self.req = req
        self.id = "msg_" + request_id
        self.model = model_name
        self.parser, self.thinks = reasoning_parser, thinks
        self.text = ""
        self.finish: str | None = None
        self.matched: str | int | None = None     # the stop string or token id that ended the answer
        self.prompt_tokens = self.cached_tokens = self.output_tokens = self.dropped_tokens = 0
        # the stream's reader, and its open block: index in the message, and kind ("text", "thinking", or the
        # tool call's index)
        self.answer = AnswerStream(req.tool_plan, reasoning_parser, thinks, req.template_kwargs)
        self.started = False
        self.blocks = 0
        self.open: str | int | None = None

    def _count(self, out: RequestOutput) -> None:
        self.prompt_tokens = out.prompt_tokens
        self.cached_tokens = max(self.cached_tokens, out.cached_tokens)
        self.output_tokens = out.completion_tokens
        self.dropped_tokens = out.dropped_prompt_tokens
        if out.finished:
            self.finish, self.matched = out.finish_reason, out.stop_reason

    def usage(self) -> dict[str, int]:
        cached = min(self.cached_tokens, self.prompt_tokens)
        usage = {"input_tokens": self.prompt_tokens - cached, "output_tokens": self.output_tokens,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}
        if self.req.params.context_overflow == "drop_oldest":     # nvllm's, as in OpenAI's usage
            usage["dropped_prompt_tokens"] = self.dropped_tokens
        return usage

    def stop(self, num_calls: int) -> tuple[str | None, str | None]:
        """(stop_reason, stop_sequence): tool_use when the answer ended with calls, stop_sequence with the
        string that matched, max_tokens when cut, end_turn otherwise."""
        if self.finish == "length":
            return "max_tokens", None
        if num_calls:
            return "tool_use", None
        if isinstance(self.matched, str) and self.matched in self.req.stop_sequences:
            return "stop_sequence", self.matched
        return ("end_turn" if self.finish is not None else None), None

    def _message(self, content: list[dict[str, Any]], num_calls: int | None) -> dict[str, Any]:
        reason, sequence = self.stop(num_calls) if num_calls is not None else (None, None)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason, "stop_sequence": sequence, "usage": self.usage()}

    # -- the whole message -------------------------------------------------------------------------
    def add(self, index: int, out: RequestOutput) -> None:
        self.text += out.text
        self._count(out)

    def response(self) -> dict[str, Any]:
        answer = read_answer(self.text, self.req.tool_plan, self.parser, self.thinks, self.req.template_kwargs)
        content: list[dict[str, Any]] = []
        if answer.reasoning:
            content.append({"type": "thinking", "thinking": answer.reasoning if self.req.show_thinking else "",
                            "signature": ""})
        if answer.text:
            content.append({"type": "text", "text": answer.text})
        for call in answer.calls:
            content.append({"type": "tool_use", "id": tool_use_id(call.id), "name": call.name,
                            "input": tool_input(call.arguments)})
        return self._message(content, len(answer.calls))

    # -- the events --------------------------------------------------------------------------------
    def events(self, index: int, out: RequestOutput) -> list[Event]:
        self._count(out)
        events = self._start()
        for d in self.answer.feed(out.text, final=out.finished):
            if d.kind == REASONING:
                events += self._block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                if self.req.show_thinking:
                    events.append(self._delta({"type": "thinking_delta", "thinking": d.text}))
            elif d.kind == TEXT:
                events += self._block("text", {"type": "text", "text": ""})
                events.append(self._delta({"type": "text_delta", "text": d.text}))
            elif d.kind == CALL:
                events += self._block(d.index, {"type": "tool_use", "id": tool_use_id(d.call_id), "name": d.name,
                                                "input": {}})
            elif d.kind == ARGUMENTS:
                events += self._block(d.index, None)
                events.append(self._delta({"type": "input_json_delta", "partial_json": d.text}))
        return events

    def _start(self) -> list[Event]:
        if self.started:
            return []
        self.started = True
        return [_event("message_start", message=self._message([], None)), _event("ping")]

    def _block(self, kind: str | int, start: dict[str, Any] | None) -> list[Event]:
        """Open a block of this kind unless it is the open one (closing that first)."""
        if self.open == kind:
            return []
        events = self._close()
        if start is not None:
            self.open = kind
            events.append(_event("content_block_start", index=self.blocks, content_block=start))
        return events

    def _close(self) -> list[Event]:
        if self.open is None:
            return []
        self.open = None
        self.blocks += 1
        return [_event("content_block_stop", index=self.blocks - 1)]

    def _delta(self, delta: dict[str, Any]) -> Event:
        return _event("content_block_delta", index=self.blocks, delta=delta)

    def closing(self) -> list[Event]:
        events = self._start() + self._close()
        reason, sequence = self.stop(self.answer.num_calls)
        events.append(_event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                             usage={"output_tokens": self.output_tokens}))
        return events + [_event("message_stop")]

    def failed(self, e: ApiError) -> Event:
        return {"event": "error", "data": json.dumps(error_body(e), ensure_ascii=False)}

    def token_counts(self) -> tuple[int, int]:
        return self.prompt_tokens, self.output_tokens


def _answering(req: AnthropicRequest, request_id: str, st: Served, thinks: bool) -> MessageBuilder:
    return MessageBuilder(req, request_id, st.model_name, st.reasoning_parser, thinks)


MESSAGES = Dialect(read_messages, _answering, anthropic_refused)
