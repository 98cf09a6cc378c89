"""nvllm -> OpenAI's Responses API: one request's RequestOutputs as the response object, or as its stream of
`response.*` server-sent events (the request is read by responses_request.py).

The answer is read as every chat front door reads it (server/chat/answer.py): its reasoning, where the
daemon has a reasoning parser, becomes a reasoning item; its text a message item; each tool call a
function_call item. Streamed, each item opens (response.output_item.added), grows by deltas and closes
(response.output_item.done) before the next opens, between response.created / response.in_progress and
response.completed (response.incomplete when max_output_tokens cut it; response.failed when the engine
failed). Every event carries its type and a sequence number counting from 0.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from nvllm.engine.outputs import RequestOutput
from nvllm.server.chat.answer import ARGUMENTS, CALL, REASONING, TEXT, AnswerStream, Delta, read_answer
from nvllm.server.http.dialect import Event
from nvllm.server.http.errors import ApiError
from nvllm.server.http.responses_request import ResponsesRequest
from nvllm.server.reading import Served

MESSAGE, FUNCTION_CALL = "message", "function_call"


def item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def reasoning_item(id_: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": id_, "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}] if text or status != "in_progress" else []}


def message_item(id_: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": id_, "status": status, "role": "assistant",
            "content": [_output_text(text)] if text or status != "in_progress" else []}


def call_item(id_: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": id_, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


@dataclass
class _Open:
    """The item being streamed: its kind (reasoning, message or function_call), its place and its text."""
    kind: str
    id: str
    index: int               # its output_index
    text: str = ""           # the reasoning, the text, or the arguments so far
    call_id: str = ""
    name: str = ""


class ResponsesAnswer:
    """Builds one request's response object, or its events, from the engine's outputs (app.py's Answering)."""

    def __init__(self, req: ResponsesRequest, request_id: str, model_name: str, reasoning_parser: str = "",
                 thinks: bool = True) -> None:
        self.req = req
        self.id = "resp_" + request_id
        self.created = int(time.time())
        self.model = model_name
        self.parser = reasoning_parser
        self.thinks = thinks
        self.text = ""
        self.finish: str | None = None
        self.prompt_tokens = self.cached_tokens = self.output_tokens = self.dropped = 0
        self.output: list[dict[str, Any]] = []       # the finished output items
        # Streaming: the answer read as it comes, the item open now, and the events' count.
        self.reader = AnswerStream(req.tool_plan, reasoning_parser, thinks, req.template_kwargs)
        self.open: _Open | None = None
        self.held = ""           # text written while a call is open: it goes out as a message after the call
        self.seq = 0
        self.started = False

    @classmethod
    def start(cls, req: ResponsesRequest, request_id: str, state: Served, thinks: bool) -> ResponsesAnswer:
        return cls(req, request_id, state.model_name, state.reasoning_parser, thinks)

    # -- the response object ---------------------------------------------------------------------
    def _count(self, out: RequestOutput) -> None:
        self.finish = out.finish_reason
        self.prompt_tokens, self.cached_tokens = out.prompt_tokens, out.cached_tokens
        self.output_tokens, self.dropped = out.completion_tokens, out.dropped_prompt_tokens

    def status(self) -> str:
        return "incomplete" if self.finish == "length" else "completed"

    def usage(self) -> dict[str, Any]:
        usage = {"input_tokens": self.prompt_tokens, "input_tokens_details": {"cached_tokens": self.cached_tokens},
                 "output_tokens": self.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": self.prompt_tokens + self.output_tokens}
        if self.dropped:      # truncation "auto" dropped the conversation's oldest turns
            usage["dropped_prompt_tokens"] = self.dropped
        return usage

    def body(self, status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
        done = status in ("completed", "incomplete")
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "completed_at": int(time.time()) if done else None, "error": error,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "model": self.model, "output": list(self.output), "usage": self.usage() if done else None,
                **self.req.echo}

    # -- whole -----------------------------------------------------------------------------------
    def add(self, index: int, out: RequestOutput) -> None:
        self.text += out.text
        if out.finished:
            self._count(out)

    def response(self) -> dict[str, Any]:
        req = self.req
        answer = read_answer(self.text, req.tool_plan, self.parser, self.thinks, req.template_kwargs)
        items = []
        if answer.reasoning:
            items.append(reasoning_item(item_id("rs"), answer.reasoning, "completed"))
        if answer.text:
            items.append(message_item(item_id("msg"), answer.text, "completed"))
        items += [call_item(item_id("fc"), c.id, c.name, c.arguments, "completed") for c in answer.calls]
        if items and self.status() == "incomplete":
            items[-1]["status"] = "incomplete"      # what max_output_tokens cut
        self.output = items
        return self.body(self.status())

    # -- streamed --------------------------------------------------------------------------------
    def event(self, kind: str, **fields: Any) -> Event:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return {"event": kind, "data": json.dumps(data, ensure_ascii=False)}

    def _begin(self) -> list[Event]:
        if self.started:
            return []
        self.started = True
        head = self.body("in_progress")
        return [self.event("response.created", response=head), self.event("response.in_progress", response=head)]

    def events(self, index: int, out: RequestOutput) -> list[Event]:
        evs = self._begin()
        for d in self.reader.feed(out.text, final=out.finished):
            evs += self._delta(d)
        if out.finished:
            self._count(out)
            evs += self._close_all(self.status())
        return evs

    def closing(self) -> list[Event]:
        status = self.status()
        evs = self._begin() + self._close_all(status)
        return evs + [self.event(f"response.{status}", response=self.body(status))]

    def failed(self, e: ApiError) -> Event:
        return self.event("response.failed", response=self.body("failed", {"code": "server_error",
                                                                            "message": e.message}))

    def token_counts(self) -> tuple[int, int]:
        return self.prompt_tokens, self.output_tokens

    def _delta(self, d: Delta) -> list[Event]:
        o = self.open
        if d.kind == CALL:
            return self._close_all("completed") + self._open(FUNCTION_CALL, call_id=d.call_id, name=d.name)
        if d.kind == ARGUMENTS:
            if o is None or o.kind != FUNCTION_CALL:
                return []         # calls open before their arguments (answer.py): nothing else comes here
            o.text += d.text
            return [self.event("response.function_call_arguments.delta", item_id=o.id, output_index=o.index,
                               delta=d.text)]
        kind = "reasoning" if d.kind == REASONING else MESSAGE
        if o is not None and o.kind == FUNCTION_CALL and kind == MESSAGE:
            self.held += d.text   # text after a call whose arguments may still grow
            return []
        evs = [] if o is not None and o.kind == kind else self._close_all("completed") + self._open(kind)
        o = self.open
        assert o is not None
        o.text += d.text
        what = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra: dict[str, Any] = {} if kind == "reasoning" else {"logprobs": []}
        return evs + [self.event(what, item_id=o.id, output_index=o.index, content_index=0, delta=d.text, **extra)]

    def _open(self, kind: str, call_id: str = "", name: str = "") -> list[Event]:
        o = _Open(kind, item_id({"reasoning": "rs", MESSAGE: "msg", FUNCTION_CALL: "fc"}[kind]), len(self.output),
                  call_id=call_id, name=name)
        self.open = o
        if kind == FUNCTION_CALL:
            return [self.event("response.output_item.added", output_index=o.index,
                               item=call_item(o.id, call_id, name, "", "in_progress"))]
        if kind == MESSAGE:
            item, part = message_item(o.id, "", "in_progress"), _output_text("")
        else:
            item, part = reasoning_item(o.id, "", "in_progress"), {"type": "reasoning_text", "text": ""}
        return [self.event("response.output_item.added", output_index=o.index, item=item),
                self.event("response.content_part.added", item_id=o.id, output_index=o.index, content_index=0,
                           part=part)]

    def _close(self, status: str) -> list[Event]:
        """Close the open item, with its whole text."""
        o = self.open
        if o is None:
            return []
        self.open = None
        at = {"item_id": o.id, "output_index": o.index}
        if o.kind == FUNCTION_CALL:
            item = call_item(o.id, o.call_id, o.name, o.text, status)
            evs = [self.event("response.function_call_arguments.done", **at, name=o.name, arguments=o.text)]
        elif o.kind == MESSAGE:
            item = message_item(o.id, o.text, status)
            evs = [self.event("response.output_text.done", **at, content_index=0, text=o.text, logprobs=[]),
                   self.event("response.content_part.done", **at, content_index=0, part=_output_text(o.text))]
        else:
            item = reasoning_item(o.id, o.text, status)
            part = {"type": "reasoning_text", "text": o.text}
            evs = [self.event("response.reasoning_text.done", **at, content_index=0, text=o.text),
                   self.event("response.content_part.done", **at, content_index=0, part=part)]
        self.output.append(item)
        evs.append(self.event("response.output_item.done", output_index=o.index, item=item))
        return evs

    def _close_all(self, status: str) -> list[Event]:
        """Close the open item, then send the text held behind it (a call) as a message of its own; the last
        item closed gets `status`."""
        evs = self._close("completed" if self.held else status)
        if self.held:
            held, self.held = self.held, ""
            evs += self._delta(Delta(TEXT, held)) + self._close(status)
        return evs
